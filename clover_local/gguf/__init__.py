"""GGUF files as the planner sees them: the header parser (:mod:`.parse`), a header turned into a
:class:`~clover_local.gguf.model.ModelDescription` (:mod:`.describe`, :mod:`.model`), reading a local file's
header (:mod:`.header`), and the names llama.cpp gives tensors and split files (:mod:`.names`).

No network code here: reading a header from the Hub is :mod:`clover_local.fetch.remote_header`.
"""
