"""Hardware detection: CPU, RAM, disk, every GPU (per GPU), and what the llama.cpp build can use.

``detect_machine()`` probes the real machine; every probe fails soft and records why in ``Machine.probes``.
``parse_simulate(spec)`` builds a described machine for ``--simulate``. The values themselves are in
``detect.machine``.
"""

from clover_local.detect.apple import metal_working_set
from clover_local.detect.probe import ProbeInputs, detect_machine
from clover_local.detect.simulate import parse_simulate

__all__ = ["ProbeInputs", "detect_machine", "metal_working_set", "parse_simulate"]
