"""Hugging Face Space entry point: serves hf-tdiag's Gradio app (the package ``hf_tdiag.gradio_app``)."""

from hf_tdiag.gradio_app import build_demo, launch

demo = build_demo()  # cheap: the default model is built on first use, not here

if __name__ == "__main__":
    launch(demo)
