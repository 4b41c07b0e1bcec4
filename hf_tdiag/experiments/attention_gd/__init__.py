"""The 1-layer attention model of Tarzanagh et al. (2023) and gradient descent on it.

* ``data`` — the paper's synthetic data (unit tokens, head ``v``, queries, labels ±1; the γ filter; the
  2-D data of Fig. 2, the nonlinear-head data of Fig. 9, orthonormal tokens for multi-token selection);
* ``heads`` — linear, ``1ᵀReLU(Vᵀu)``, ``vᵀu − λ‖u‖²`` and random-MLP prediction heads;
* ``model`` — ``f(X) = h(Xᵀ softmax(X W z))``, the logistic loss, and the linear head's gradient in log
  space (its direction survives softmax saturation);
* ``train`` — (normalized) GD on ``W`` or ``W = K Qᵀ`` at the paper's settings, one run or a batch of runs,
  recording the correlation ``⟨W_t, W_ref⟩ / (‖W_t‖_F ‖W_ref‖_F)`` with reference matrices;
* ``verdicts`` — global / local / undetermined convergence, Assumption B.1 (a separating first gradient);
* ``gen_svm`` — the generalized SVM prediction ``W_fin + R·W_dir`` for nonlinear heads and the authors'
  run-exclusion rule.
"""

from .data import (
    AttentionData,
    make_attention_data,
    make_orthonormal_data,
    make_planted_local_instance,
    make_relu_head_data,
    make_trajectory_data,
    passes_gap_filter,
    score_gap,
    stack_data,
)
from .gen_svm import GenSVMFit, gen_svm_excluded, gen_svm_fit
from .heads import LambdaHead, MLPHead, ReLUHead
from .model import attention_logits, attention_loss, attention_output, loss_and_grad_linear
from .train import GDBatch, GDRun, train_attention, train_attention_batch
from .verdicts import (
    ConvergenceVerdict,
    all_support,
    convergence_verdict,
    initial_gradient_separates,
    is_locally_optimal,
)

__all__ = [
    "AttentionData",
    "make_attention_data",
    "make_planted_local_instance",
    "make_trajectory_data",
    "make_relu_head_data",
    "make_orthonormal_data",
    "score_gap",
    "passes_gap_filter",
    "stack_data",
    "attention_logits",
    "attention_output",
    "attention_loss",
    "loss_and_grad_linear",
    "MLPHead",
    "ReLUHead",
    "LambdaHead",
    "GDRun",
    "GDBatch",
    "train_attention",
    "train_attention_batch",
    "ConvergenceVerdict",
    "convergence_verdict",
    "is_locally_optimal",
    "all_support",
    "initial_gradient_separates",
    "GenSVMFit",
    "gen_svm_fit",
    "gen_svm_excluded",
]
