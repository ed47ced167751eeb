/* The book's own page fixes (added to every page by _ext/memlab_pages.py).

   The menu buttons: pydata-sphinx-theme 0.17 listens on the first ".primary-toggle" (and
   ".secondary-toggle") of a page only, the one in its own header, while sphinx-book-theme shows
   its own button of that class in the article header: at phone and tablet widths that is the
   only one on screen, and it did nothing, so the table of contents could not be opened
   (pydata-sphinx-theme issue 2451). A click on any later button of the kind is passed to the
   first, which opens the sidebar as a dialog on narrow screens and collapses it on wide ones. */
(function () {
  "use strict";

  function forwardToggles(kind) {
    var buttons = document.querySelectorAll("." + kind + "-toggle");
    var first = buttons[0];
    for (var i = 1; i < buttons.length; i++) {
      buttons[i].addEventListener("click", function (event) {
        event.preventDefault();
        event.stopPropagation();
        event.currentTarget.blur();
        first.click();
      });
    }
  }

  function init() {
    forwardToggles("primary");
    forwardToggles("secondary");
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", init);
  } else {
    init();
  }
})();
