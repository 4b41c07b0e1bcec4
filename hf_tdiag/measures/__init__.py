"""Pure tensor math, no model knowledge (see DESIGN.md: model -> probe -> measure -> metric)."""
