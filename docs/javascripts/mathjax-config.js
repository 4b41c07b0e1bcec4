// MathJax 2 configuration, read by MathJax.js (served from this site: scripts/mkdocs_mathjax.py copies it in at
// build time; no CDN). pymdownx.arithmatex writes each formula as a <script type="math/tex"> element, which the TeX
// input jax reads directly, so no page-scanning preprocessor is loaded.
window.MathJax = {
  jax: ["input/TeX", "output/CommonHTML"],
  extensions: [],
  TeX: { extensions: ["AMSmath.js", "AMSsymbols.js"] },
  CommonHTML: { scale: 100 },
  showMathMenu: false,
  messageStyle: "none",
  "fast-preview": { disabled: true },
};
