"""One module per tool-call format, each declaring everything about it in its `FORMAT` (a
`sgl.tool_calls.base.ToolFormat`): its parser, names and SGLang aliases, how a chat template
shows it, how a call is written and constrained. `sgl.tool_calls.registry` lists them."""
