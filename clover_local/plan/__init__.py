"""Planning: a described machine and a model in, a plan (settings, memory breakdown, reasons) out. No I/O."""
