import sys
import unittest

sys.path.insert(0, "/app")

import mathlib  # noqa: E402


class MeanTests(unittest.TestCase):
    def test_integers(self):
        self.assertEqual(mathlib.mean([1, 2, 3, 4]), 2.5)

    def test_empty_raises(self):
        with self.assertRaises(ValueError):
            mathlib.mean([])


class MedianTests(unittest.TestCase):
    def test_odd_length(self):
        self.assertEqual(mathlib.median([7, 1, 3]), 3)

    def test_even_length(self):
        self.assertEqual(mathlib.median([4, 1, 3, 2]), 2.5)

    def test_even_length_unsorted_floats(self):
        self.assertAlmostEqual(mathlib.median([10.0, 0.5, 2.5, 8.0, 1.0, 4.0]), 3.25)

    def test_does_not_mutate_input(self):
        data = [3, 1, 2]
        mathlib.median(data)
        self.assertEqual(data, [3, 1, 2])

    def test_empty_raises(self):
        with self.assertRaises(ValueError):
            mathlib.median([])


class ClampTests(unittest.TestCase):
    def test_inside(self):
        self.assertEqual(mathlib.clamp(5, 0, 10), 5)

    def test_below_and_above(self):
        self.assertEqual(mathlib.clamp(-3, 0, 10), 0)
        self.assertEqual(mathlib.clamp(42, 0, 10), 10)

    def test_bad_bounds(self):
        with self.assertRaises(ValueError):
            mathlib.clamp(1, 5, 2)


if __name__ == "__main__":
    unittest.main()
