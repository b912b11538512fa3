"""More than one machine: llama.cpp's RPC backend. A worker (``rpc-server``) lends its devices to the main
machine's ``llama-server --rpc``. This package reads a worker's devices and measures the link to it through the
RPC protocol itself (:mod:`.protocol`, :mod:`.probe`) and explains a lost worker (:mod:`.failures`). Workers are
described in :mod:`clover_local.detect.remote`, planned in :mod:`clover_local.plan.pooled`, and ``rpc-server`` is
run by :mod:`clover_local.llamacpp.rpc_server`."""
