"""The explorers of chapters 5 and 6: the stored grid against fresh computations, the readings
at the extremes, and what the website and the widget are given."""

import itertools
import math
import random

import pytest

from kernels import results
from kernels.rounding_lab import site_explorers as se, slider_grid as sg
from kernels.tools.interactive import explorer_html


@pytest.fixture(scope="module")
def stored():
    return results.load("fix_explorer")


def _same(a: dict, b: dict) -> bool:
    return all((math.isnan(a[f]) and math.isnan(b[f])) or a[f] == b[f] for f in sg.FIELDS)


def _settings(rng, n):
    axes = [list(sg.V_PRESETS), sg.SPREADS, sg.TIES, sg.GAPS, sg.BETAS, sg.EPSILONS]
    return [dict(zip(sg.DEFAULT, (rng.choice(a) for a in axes))) for _ in range(n)]


def test_the_stored_grid_says_how_it_was_made(stored):
    p = stored["provenance"]
    # as recorded: the grid was stored before kernels.lab became kernels.rounding_lab
    made = ("python -m kernels.rounding_lab.slider_grid", "python -m kernels.lab.slider_grid")
    assert p["gpu"] is None and p["command"] in made
    assert "computed on a CPU" in results.describe(stored)
    data = stored["data"]
    assert data["rows"] == sg.ROWS and data["seed"] == 0
    assert data["axes"]["beta"] == list(sg.BETAS) and data["axes"]["eps"] == list(sg.EPSILONS)
    n_bases = len(sg.V_PRESETS) * len(sg.SPREADS) * len(sg.TIES) * len(sg.GAPS)
    assert len(data["bases"]) == n_bases
    assert all(len(b["rule"]) == len(sg.BETAS) * len(sg.EPSILONS) for b in data["bases"])


def test_random_stored_cells_recompute_bit_for_bit(stored):
    """The widget recomputes a cell with the stored seed: the numbers must be the stored ones."""
    for setting in _settings(random.Random(), 3) + [sg.DEFAULT]:
        fresh = sg.cell(**setting)
        kept = sg.lookup(stored["data"], **setting)
        for impl in sg.IMPLS:
            assert _same(fresh[impl], kept[impl]), (setting, impl, fresh[impl], kept[impl])


def test_random_cells_on_fresh_rows_agree_within_their_errors(stored):
    """Fresh rows (another seed) give the stored bias, rms and NaN share within the noise."""
    rng = random.Random()
    for setting in _settings(rng, 2):
        fresh = sg.cell(**setting, seed=rng.randrange(1, 10**6))
        kept = sg.lookup(stored["data"], **setting)
        for impl in sg.IMPLS:
            a, b = fresh[impl], kept[impl]
            assert abs(a["bad"] - b["bad"]) < 0.15, (setting, impl, a, b)
            if a["bad"] > 0 or b["bad"] > 0 or math.isnan(a["bias"]) or math.isnan(b["bias"]):
                continue  # few finite rows: the bias of what is left is not comparable
            # 32 sequences per cell: the errors are heavier-tailed than normal, hence 6 σ
            tol = 6 * math.hypot(a["bias_se"], b["bias_se"]) + 0.02
            assert abs(a["bias"] - b["bias"]) < tol, (setting, impl, a, b)
            if max(a["rms"], b["rms"]) > 1:
                continue  # O near 0: a few huge errors make the rms of one draw (chapter 6, §2)
            tol = 6 * math.hypot(a["rms_se"], b["rms_se"]) + 0.1 * max(a["rms"], b["rms"])
            assert abs(a["rms"] - b["rms"]) < tol, (setting, impl, a, b)


def test_the_readings_at_the_extremes(stored):
    def reading(**change):
        s = {**sg.DEFAULT, **change}
        return se.fixes_reading(sg.lookup(stored["data"], **s), s["beta"], s["eps"], s["ties"])

    at_64 = reading(beta=64.0)
    assert at_64.startswith("ℓ underflows:") and "% of the rule's outputs are NaN or inf" in at_64
    assert sg.lookup(stored["data"], **{**sg.DEFAULT, "beta": 64.0})["rule"]["bad"] > 0.3
    assert reading(ties=1).startswith("the rule changes nothing here (one maximum")
    assert reading().startswith("the rule removes the bias")
    assert "ε < 2⁻⁹ misses the near-ties" in reading(eps=2**-10)
    assert "ε < 2⁻⁹" not in reading(eps=2**-9)


def test_the_fixes_page_holds_every_setting_and_stays_small(stored):
    spec = se.fixes_spec(stored["data"])
    sizes = [len(c["values"]) for c in spec["controls"]]
    assert [c["name"] for c in spec["controls"]] == list(sg.DEFAULT)
    assert len(spec["reading"]) == math.prod(sizes)
    for s in spec["series"]:
        assert len(s["data"]) == math.prod(sizes[: s["depends"]]) * 2 * len(spec["panels"])
    assert (
        spec["controls"][4]["values"][0] == "1 + 2⁻¹⁰" and spec["controls"][4]["values"][-1] == "64"
    )
    assert "near-ties caught" in spec["controls"][5]["values"][sg.EPSILONS.index(2**-9)]
    page = explorer_html(spec)
    assert len(page.encode()) < 1_000_000  # the page's budget is 2 MB
    assert 'type="range"' in page and "<select" in page and "<label for=" in page
    assert "http" not in page.replace("http://www.w3.org/2000/svg", "")  # nothing fetched


def test_the_sources_explorer_reads_the_stored_gpu_sweep():
    sweep = results.load("lab_sweep_gpu")
    spec = se.sources_spec(sweep["data"]["records"])
    sizes = [len(c["values"]) for c in spec["controls"]]
    assert sizes == [4, 4, 6] and len(spec["reading"]) == 96
    default = [c["default"] for c in spec["controls"]]
    first = spec["readings"][spec["reading"][(default[0] * 4 + default[1]) * 6 + default[2]]]
    assert first.startswith("storage dominates")  # tied −1, other 0, k = 2, gap 16
    readings = [spec["readings"][i] for i in spec["reading"]]
    assert any(r.startswith("accumulation matters") for r in readings)


@pytest.mark.parametrize("kind", ["fixes", "sources"])
def test_the_widget_has_the_site_controls(stored, kind):
    source = stored["data"] if kind == "fixes" else results.load("lab_sweep_gpu")["data"]["records"]
    spec = se.fixes_spec(source) if kind == "fixes" else se.sources_spec(source)
    box = se.widget(kind, source)
    controls = box.children[:-1]
    assert [c.description for c in controls] == [c["label"] for c in spec["controls"]]
    assert [c.value for c in controls] == [c["default"] for c in spec["controls"]]
    assert [len(c.options) for c in controls] == [len(c["values"]) for c in spec["controls"]]


def test_one_widget_update_is_quick_enough():
    assert se.update_seconds(repeats=1) < 2.0  # the chapter prints the measured time


def test_the_update_timer_reports_every_device_it_has(tmp_path):
    import torch

    timed = se.time_update(repeats=1)
    assert 0 < timed["cpu_s"] < 2.0 and timed["cpu_threads"] == torch.get_num_threads()
    assert ("gpu_s" in timed) == torch.cuda.is_available()
    if torch.cuda.is_available():  # the GPU's cell next to the CPU's (the stored grid's)
        assert timed["gpu_vs_cpu_largest_difference"] < 0.05


def test_largest_difference_sees_one_changed_number(stored):
    pick = random.Random()
    values = {name: pick.choice(axis) for name, axis in stored["data"]["axes"].items()}
    c = sg.lookup(stored["data"], **values)
    assert sg.largest_difference(c, c) == 0.0
    changed = {impl: dict(stats) for impl, stats in c.items()}
    impl, field = pick.choice(sg.IMPLS), pick.choice(("bias", "rms"))
    if not math.isfinite(changed[impl][field]):
        changed[impl][field] = 0.0  # a NaN cell: compare finite numbers only
        assert sg.largest_difference(c, changed) == 0.0
        return
    changed[impl][field] += 0.25
    assert sg.largest_difference(c, changed) == pytest.approx(0.25)


def test_labels_of_every_axis_value_are_distinct():
    for c in se.fixes_controls(se._fix_axes()):
        assert len(set(c["values"])) == len(c["values"]), c


def test_a_reading_says_when_two_effects_cancel(stored):
    """At β = 1 + 2⁻¹⁰ the tied P̄ rounds back to 1 in half the rows (r_m up to 2 of 0.03 to
    3.97), where FA2's bias stays; a mean near 0 there is the other rows pushed the other way,
    not a bias removed (issue 45)."""
    beta = stored["data"]["axes"]["beta"][0]
    assert beta == 1 + 2**-10
    assert abs(se.rows_at_one(beta) - 0.5) < 0.01 and se.rows_at_one(2.0) == 0.0
    ax = stored["data"]["axes"]
    said = [
        se.fixes_reading(sg.lookup(stored["data"], p, s, k, g, beta, e), beta, e, k)
        for p, s, k, g, e in itertools.product(
            ax["preset"], ax["spread"], ax["ties"], ax["gap"], ax["eps"]
        )
    ]
    assert not any(r.startswith("the rule removes the bias") for r in said)
    case = {**sg.DEFAULT, "beta": beta, "gap": 12.0, "spread": 0.1}
    cell = sg.lookup(stored["data"], **case)
    line = se.fixes_reading(cell, beta, case["eps"], case["ties"])
    assert line.startswith("two effects cancel") and "50 % of the rows" in line, line
    assert se.cancels(cell["fa2"], 0.5) and not se.cancels(cell["fa2"], 0.0)


def test_without_javascript_the_explorer_shows_its_default_setting(stored):
    """A <noscript> holds the default setting as an image (a PNG with the book's legibility
    record), with alt text and the reading of that setting (issue 45)."""
    import base64
    import re

    from kernels.tools import interactive, style

    spec = se.fixes_spec(stored["data"])
    page = explorer_html(spec)
    hidden = re.search(r"<noscript>(.*?)</noscript>", page, re.S)
    assert hidden, "no <noscript> fallback"
    src = re.search(r'src="data:image/png;base64,([^"]+)"', hidden.group(1)).group(1)
    png = base64.b64decode(src)
    assert png.startswith(b"\x89PNG") and style.read_record(png)[style.PNG_KEY_DPI]
    _, index = interactive.default_setting(spec)
    reading = spec["readings"][spec["reading"][index]]
    assert reading == se.fixes_reading(
        sg.lookup(stored["data"], **sg.DEFAULT), sg.DEFAULT["beta"], sg.DEFAULT["eps"], 2
    )
    alt = re.search(r'alt="([^"]+)"', hidden.group(1)).group(1)
    assert spec["title"] in alt and "default setting" in alt
    assert interactive.value_label(0.1729, {"unit": "ulp", "signed": True}) == "+0.17"
    assert interactive.value_label(-0.00571, {"unit": "ulp", "signed": True}) == "−0.0057"
    assert interactive.value_label(59.4, {"unit": "%"}) == "59 %"


def test_the_controls_wrap_on_a_narrow_screen():
    """Each control's label, field and value wrap onto lines of their own rather than push the
    explorer wider than a phone's screen; the site test measures it at 420 px."""
    from kernels.tools import interactive

    css = interactive.CSS
    assert "flex-wrap:wrap" in css and "min-width:0" in css and "overflow-wrap:anywhere" in css
    assert "book-explorer-skip" in css and "NARROW" in interactive.SCRIPT.read_text()
