"""More than one machine: llama.cpp's RPC backend. A worker (``rpc-server``) lends its devices to the main
machine's ``llama-server --rpc``; this package names workers (``endpoints``), reads their devices and measures
the link through the RPC protocol itself (``protocol``), and runs a worker (``worker``)."""
