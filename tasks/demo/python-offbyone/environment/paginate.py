"""Split a list of items into numbered pages (page numbers start at 1)."""


def page_count(total_items, per_page):
    """Number of pages needed to show total_items, per_page items per page.

    Zero items need zero pages; a partly filled last page still counts.
    """
    if per_page < 1:
        raise ValueError("per_page must be at least 1")
    return total_items // per_page


def get_page(items, page, per_page):
    """Return the items shown on the given 1-based page.

    Pages past the end are empty lists; page numbers below 1 are an error.
    """
    if page < 1:
        raise ValueError("page numbers start at 1")
    if per_page < 1:
        raise ValueError("per_page must be at least 1")
    start = page * per_page
    return items[start:start + per_page]
