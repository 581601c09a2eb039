"""Talking to a model token-exactly, as agents and the capture proxy both do: the session that
records every turn and summarizes when the context fills (`session`), chat templates rendered to
token ids (`rendering`), and tool calls parsed out of completions (`tool_calls`)."""
