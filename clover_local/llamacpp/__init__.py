"""Upstream llama.cpp binaries: finding ``llama-server`` and what it can do (:mod:`.binary`), fitting a plan's argv
to it (:mod:`.server_args`), running it as a child process (:mod:`.server`) and talking to it
(:mod:`.http_client`, :mod:`.server_engine`), comparing a plan with ``llama-fit-params`` (:mod:`.fit_params`),
and running the RPC worker ``rpc-server`` (:mod:`.rpc_server`).

Building the binaries is ``scripts/build-llama-server``; the OpenAI API clover-local serves is :mod:`clover_local.serve`.
"""
