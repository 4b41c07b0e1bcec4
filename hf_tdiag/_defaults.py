"""Default values shared by the measures, the command line, the evaluate modules, the report and the Space.

Torch-free on purpose: the command line reads them to build its ``--help`` without importing torch.
"""

# Lipschitz constant of the FFN activation in the Schatten / Edelman bound proxies (GELU's, Sakai & Imaizumi 2026)
DEFAULT_L_PHI = 1.13
# relative singular-value threshold below which a singular value does not count towards a matrix's rank
DEFAULT_RANK_TOL = 1e-10


#: the sections of ``hf-tdiag report``, in page order (the command line checks --sections against them)
REPORT_SECTIONS = ("summary", "srr", "schatten", "concept_fidelity", "attention_svm", "objective_ledger")
#: the sections that run the model on inputs (the others read its weights and config)
SECTIONS_WITH_INPUTS = ("srr", "concept_fidelity", "attention_svm", "objective_ledger")

__all__ = ["DEFAULT_L_PHI", "DEFAULT_RANK_TOL", "REPORT_SECTIONS", "SECTIONS_WITH_INPUTS"]
