"""Where the Hugging Face workload lived before workload/ (workload/hf.py): its names, kept for
the code and scripts that import them from here. `check_models` and `import_modeling` take any
workload, a factory too (workload/checks.py)."""

from stepbench.workload.checks import check_models, import_modeling  # noqa: F401
from stepbench.workload.hf import (LIST_MODEL_TYPES, PRESETS, build_config,  # noqa: F401
                                   build_model, config_dict, synthetic_batch)
