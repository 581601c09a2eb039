"""The hidden cases: (name, function, arguments). Answers are compared with reference.py's."""

MODULE = "mathlib"
TIMEOUT_S = 30
CASES = [
    ("mean_integers", "mean", ([1, 2, 3, 4],)),
    ("mean_empty", "mean", ([],)),
    ("median_odd", "median", ([7, 1, 3],)),
    ("median_even", "median", ([4, 1, 3, 2],)),
    ("median_even_floats", "median", ([10.0, 0.5, 2.5, 8.0, 1.0, 4.0],)),
    ("median_keeps_input", "median", ([3, 1, 2],)),
    ("median_empty", "median", ([],)),
    ("clamp_inside", "clamp", (5, 0, 10)),
    ("clamp_below", "clamp", (-3, 0, 10)),
    ("clamp_above", "clamp", (42, 0, 10)),
    ("clamp_bad_bounds", "clamp", (1, 5, 2)),
]
