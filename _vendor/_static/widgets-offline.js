// Runs on pages with saved ipywidgets, after vendor/requirejs/require.js and before
// vendor/jupyter-widgets/embed-amd.js (nb_ipywidgets_js in _config.yml).
(function () {
  "use strict";

  // 1. The widget manager finds its icon fonts next to its own AMD module URL, which RequireJS
  //    would place beside the page (chapters/@jupyter-widgets/...): map the module to the
  //    vendored folder so the fonts load from the book.
  require.config({
    paths: {
      "@jupyter-widgets/html-manager/dist": new URL("vendor/jupyter-widgets", document.currentScript.src).href,
    },
  });

  // 2. @jupyter-widgets typesets descriptions with the MathJax 2 API, MathJax.Hub.Queue, whenever
  //    window.MathJax exists (jupyter-widgets/ipywidgets#3829); the book serves MathJax 3, which has
  //    no Hub, so every widget on a page with math would throw. Give each object assigned to
  //    window.MathJax (the config object, then MathJax 3 itself) a Hub that forwards to MathJax 3.
  const hub = {
    Queue(job) {
      const element = Array.isArray(job) ? job[2] : null;
      const mathjax = window.MathJax;
      if (!element || !mathjax || typeof mathjax.typesetPromise !== "function") {
        return; // MathJax 3 not started yet: its first pass typesets the whole page anyway
      }
      const started = (mathjax.startup && mathjax.startup.promise) || Promise.resolve();
      started
        .then(() => mathjax.typesetPromise([element]))
        .catch((err) => console.warn("MathJax could not typeset a widget", err));
    },
  };
  let current = window.MathJax;
  const withHub = (value) => {
    if (value && typeof value === "object" && !value.Hub) {
      value.Hub = hub;
    }
    return value;
  };
  withHub(current);
  Object.defineProperty(window, "MathJax", {
    configurable: true,
    get: () => current,
    set: (value) => {
      current = withHub(value);
    },
  });
})();
