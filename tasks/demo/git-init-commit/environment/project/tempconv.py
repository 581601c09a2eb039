import sys


def c_to_f(c):
    return c * 9 / 5 + 32


def f_to_c(f):
    return (f - 32) * 5 / 9


if __name__ == "__main__":
    unit, value = sys.argv[1], float(sys.argv[2])
    print(c_to_f(value) if unit == "c" else f_to_c(value))
