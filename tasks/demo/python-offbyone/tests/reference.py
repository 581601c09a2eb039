"""The correct module, for the judge's expected answers (never shown to the agent)."""


def page_count(total_items, per_page):
    if per_page < 1:
        raise ValueError("per_page must be at least 1")
    return (total_items + per_page - 1) // per_page


def get_page(items, page, per_page):
    if page < 1:
        raise ValueError("page numbers start at 1")
    if per_page < 1:
        raise ValueError("per_page must be at least 1")
    start = (page - 1) * per_page
    return items[start:start + per_page]
