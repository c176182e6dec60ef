"""llama.cpp's ``llama-server`` as a real OpenAI-compatible generation engine on this machine.

Modules, one job each: ``cache`` (where the build and the model live), ``build`` (compile llama-server
once per machine), ``model`` (write the tiny random-weight GGUF model), ``server`` (start, stop and
status of named server instances). See docs/llm-local.md.
"""
