"""The detectors, in the order they run. A detector is a class with a `CATEGORY`, a one-line
`DESCRIPTION`, the context parts it needs (`REQUIRES`) and a `find(context) -> list[Finding]`
(`context.Detector`). A new category is one new file plus one line here.
"""

from __future__ import annotations

from eaglegate.analyzer.couplings.buffer import BufferDetector
from eaglegate.analyzer.couplings.config_cap import ConfigCapDetector
from eaglegate.analyzer.couplings.context import Detector
from eaglegate.analyzer.couplings.cuda_graph import CudaGraphDetector
from eaglegate.analyzer.couplings.draft_state import DraftStateDetector
from eaglegate.analyzer.couplings.handoffs import HandoffDetector
from eaglegate.analyzer.couplings.mode_check import ModeCheckDetector
from eaglegate.analyzer.couplings.runtime_check import RuntimeCheckDetector
from eaglegate.analyzer.couplings.spec_path import SpecPathDetector
from eaglegate.analyzer.couplings.state_rows import StateRowsDetector
from eaglegate.analyzer.couplings.step_work import StepWorkDetector
from eaglegate.analyzer.couplings.tiers import TierDetector

# The order matters: a finding two detectors report is kept as the first reports it, and
# cuda_graph names the graph runners, which buffer reads from the shared scratch space;
# HandoffDetector reads the findings before it (`scratch["findings"]`), so it runs last.
DETECTORS: tuple[type[Detector], ...] = (
    CudaGraphDetector, RuntimeCheckDetector, BufferDetector, DraftStateDetector, StateRowsDetector,
    ModeCheckDetector, SpecPathDetector, StepWorkDetector, TierDetector, ConfigCapDetector,
    HandoffDetector,
)


def detectors() -> list[Detector]:
    return [detector() for detector in DETECTORS]
