"""Training one model on one task: the loop (:mod:`.loop`), its checkpoints and result files
(:mod:`.checkpoints`) and the memory probe (:mod:`.memory`). What a caller needs is re-exported here."""

from ..config import TrainConfig
from .checkpoints import (
    CHECKPOINT_FORMAT,
    check_output_folder,
    check_output_path,
    default_checkpoint,
    load_checkpoint,
    read_checkpoint,
    result_lock,
    save_checkpoint,
    write_result,
)
from .loop import (
    Analysis,
    Task,
    Unconverged,
    build_optimizer,
    float32_list,
    learned_priors,
    load_final,
    marginals_method,
    model_config,
    setup_run,
    train,
    train_step,
)
from .memory import memory_probe

__all__ = ["CHECKPOINT_FORMAT", "Analysis", "Task", "TrainConfig", "Unconverged", "build_optimizer",
           "check_output_folder", "check_output_path", "default_checkpoint", "float32_list", "learned_priors",
           "load_checkpoint", "load_final", "marginals_method", "memory_probe", "model_config", "read_checkpoint",
           "result_lock", "save_checkpoint", "setup_run", "train", "train_step", "write_result"]
