"""Read a value that is only drawn in a picture: the task's answer is in no text the agent can
read, so only a model that sees the image can solve it (a vision-language model)."""

from __future__ import annotations

import io
import random

from skyrl_agent.tasks.families.base import Blueprint, Family, check_answer

COLOURS = {"red": (215, 40, 40), "green": (40, 165, 60), "blue": (40, 80, 215),
           "yellow": (235, 205, 40), "purple": (135, 60, 175), "orange": (240, 135, 30),
           "black": (25, 25, 25), "grey": (140, 140, 140)}
"""Colour names and the RGB they are drawn in: far apart, and named alike by anyone."""
ANSWER = "/app/answer.txt"


def png(width: int, height: int, boxes: list[tuple[tuple[int, int, int, int], str]],
        background: tuple[int, int, int] = (250, 250, 250)) -> bytes:
    """A PNG of `boxes` ((left, top, right, bottom), colour name) on a plain background; the
    same arguments give the same bytes."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (width, height), background)
    draw = ImageDraw.Draw(image)
    for box, colour in boxes:
        draw.rectangle(box, fill=COLOURS[colour])
    out = io.BytesIO()
    image.save(out, format="PNG", optimize=False)
    return out.getvalue()


def bar_chart(rng: random.Random, colours: list[str]) -> tuple[bytes, str]:
    """Vertical bars of different heights, one per colour; the chart and the tallest's colour."""
    heights = rng.sample(range(12, 60), len(colours))
    width = 14 * len(colours) + 6
    boxes = [((6 + 14 * i, 64 - h, 16 + 14 * i, 63), colour)
             for i, (h, colour) in enumerate(zip(heights, colours, strict=True))]
    return png(width, 64, boxes), colours[heights.index(max(heights))]


def build_picture(rng: random.Random, difficulty: int) -> Blueprint:
    files: dict[str, bytes] = {}
    pictures: dict[str, bytes] = {}
    write = f"Write only the colour's name (one of {', '.join(COLOURS)}) to `{ANSWER}`."
    if difficulty == 1:
        answer = rng.choice(list(COLOURS))
        size = rng.randint(24, 64)
        picture = png(size, size, [((0, 0, size, size), answer)])
        instruction = f"What colour is this picture?\n\n![a picture](picture.png)\n\n{write}\n"
        pictures["picture.png"] = picture
        plan = f"The picture is {answer}; write that."
    else:
        chart, answer = bar_chart(rng, rng.sample(list(COLOURS), rng.randint(3, 4)))
        if difficulty == 2:
            instruction = ("Which bar of this chart is the tallest?\n\n![a bar chart](chart.png)"
                           f"\n\n{write}\n")
            pictures["chart.png"] = chart
        else:
            instruction = ("The file `/app/chart.png` is a bar chart. Look at it and find its "
                           f"tallest bar. {write}\n")
            files["chart.png"] = chart
        plan = f"The tallest bar is {answer}; write that."
    return Blueprint(instruction=instruction, checks=check_answer(ANSWER, answer),
                     solution=(f"printf '%s\\n' {answer} > {ANSWER}",), plan=plan, files=files,
                     pictures=pictures)


FAMILIES = (
    Family("read-picture", "Read a colour that is only drawn in a picture.",
           ("a picture of one colour, shown in the instruction",
            "a bar chart shown in the instruction: the tallest bar's colour",
            "a bar chart in the sandbox (/app/chart.png): look at it, then answer"),
           build_picture, category="vision"),
)
