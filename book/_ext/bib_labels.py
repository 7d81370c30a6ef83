"""Sphinx extension: readable citation labels for entries whose author is an organisation.

The book cites with sphinxcontrib-bibtex's default "alpha" labels ([QY25], [Dao24]). pybtex
builds such a label from the author's last name, so a corporate author written as one braced
name, ``author = {{The Triton authors}}``, became ``[TheTauthors25b]``. Dropping the author
fixes the label but sorts the entry first and loses the attribution. This extension registers
the formatting style ``book``: the alpha style, except that an entry with a ``shortauthor``
field is labelled by it and the year (``shortauthor = {Tri}`` gives ``[Tri25a]``), and entries
sort by their authors' names without braces or a leading "The" (so "{The Triton authors}" sorts
under T, not after Z). The entry keeps its author for the text. Selected by ``bibtex_default_style: book`` in
_config.yml; loaded through ``sphinx.local_extensions`` there. The style also renders an entry's
``code`` field (a repository's address) as a link after its other links.
"""
from pybtex.plugin import register_plugin
from pybtex.style.formatting.alpha import Style as AlphaStyle
from pybtex.style.labels.alpha import LabelStyle as AlphaLabelStyle
from pybtex.style.sorting.author_year_title import SortingStyle as AuthorYearTitle
from pybtex.style.template import field, href, join, optional, sentence, words


class LabelStyle(AlphaLabelStyle):
    def format_label(self, entry):
        short = entry.fields.get("shortauthor")
        if short:
            return short + entry.fields.get("year", "")[-2:]
        return super().format_label(entry)


class SortingStyle(AuthorYearTitle):
    def person_key(self, person):
        key = super().person_key(person).replace("{", "").replace("}", "")
        return key[4:] if key.startswith("the ") else key


class Style(AlphaStyle):
    default_label_style = "book"
    default_sorting_style = "book"

    def format_web_refs(self, e):
        """The alpha style's links, then an entry's ``code`` field as a link ("Code: URL.")."""
        url = field("code", raw=True)
        code = optional[sentence[words["Code:", href[url][url]]]]
        return join(sep=" ")[super().format_web_refs(e), code]


def setup(app):
    register_plugin("pybtex.style.labels", "book", LabelStyle)
    register_plugin("pybtex.style.sorting", "book", SortingStyle)
    register_plugin("pybtex.style.formatting", "book", Style)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
