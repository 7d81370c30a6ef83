"""Import the book's package first: it switches Triton to its CPU interpreter when there is no
GPU, which must happen before any test module imports triton."""
import kernels  # noqa: F401
