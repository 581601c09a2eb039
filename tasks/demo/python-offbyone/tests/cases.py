"""The hidden cases: (name, function, arguments). Answers are compared with reference.py's."""

MODULE = "paginate"
TIMEOUT_S = 30
ITEMS = list(range(1, 8))
LETTERS = list("abcdefghij")
CASES = [
    ("count_7_3", "page_count", (7, 3)), ("count_6_3", "page_count", (6, 3)),
    ("count_0_3", "page_count", (0, 3)), ("count_1_1", "page_count", (1, 1)),
    ("count_10_4", "page_count", (10, 4)), ("count_bad", "page_count", (5, 0)),
    ("page_1", "get_page", (ITEMS, 1, 3)), ("page_2", "get_page", (ITEMS, 2, 3)),
    ("page_3", "get_page", (ITEMS, 3, 3)), ("page_4", "get_page", (ITEMS, 4, 3)),
    ("letters_1_10", "get_page", (LETTERS, 1, 10)), ("letters_5_2", "get_page", (LETTERS, 5, 2)),
    ("empty", "get_page", ([], 1, 5)), ("page_0", "get_page", (ITEMS, 0, 3)),
    ("per_0", "get_page", (ITEMS, 1, 0)),
] + [  # every item exactly once across all pages
    (f"cover_{n}_{per}_{page}", "get_page", (list(range(n)), page, per))
    for n in range(12) for per in range(1, 5) for page in range(1, -(-n // per) + 2)
] + [(f"count_{n}_{per}", "page_count", (n, per)) for n in range(12) for per in range(1, 5)]
