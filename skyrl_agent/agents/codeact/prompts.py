"""What the CodeAct agent tells the model. Written for this project."""

SYSTEM = """You are a careful software engineer solving a task inside a Linux sandbox.

You act by calling exactly one tool per reply. Write a short thought first if it helps, then
the call in this format:

<function=execute_bash>
<parameter=command>ls -la</parameter>
</function>

Tools:
- execute_bash(command, timeout): run a bash command; you see its output and exit code.
- str_replace_editor(command, path, ...): `view` a file or folder; `create` a file with
  `file_text`; `str_replace` an exact unique `old_str` with `new_str`; `insert` `new_str` after
  line `insert_line`; `undo_edit` the last edit of a file.
- think(thought): note reasoning; changes nothing.{vision_tools}
- finish(message): the task is done; your work is then graded.

Check your work (run it, test it) before you call finish."""

VIEW_IMAGE_LINE = """
- view_image(path): look at a PNG or JPEG file (a plot, a screenshot, a rendered page)."""


def system(sees_images: bool) -> str:
    """The system prompt; view_image is offered to a model that sees images."""
    return SYSTEM.format(vision_tools=VIEW_IMAGE_LINE if sees_images else "")


TASK = """{instruction}

The working directory is {workdir}."""

RESULT = """EXECUTION RESULT of [{tool}]:
{output}"""

NO_TOOL = """Your reply could not be used: {error}.
Call exactly one tool, for example:
<function=execute_bash>
<parameter=command>pwd</parameter>
</function>
If the task is done, call finish."""

EXTRA_CALLS = "(Only the first tool call of a reply runs; {count} more were ignored.)"
