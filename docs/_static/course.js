/* The course website: tap a figure to see it at full size; a formula too wide for its line scrolls.
 *
 * On a phone a figure is shrunk to the column's width, too small to read its axis labels. Every
 * image of a page becomes a link to its file (which works without this script, too), and a tap
 * opens it at its own size in a viewer that scrolls and zooms; a tap, Escape or the close
 * button goes back to the page.
 *
 * MathJax 3 cannot break an inline formula across lines: one wider than its paragraph would
 * widen the page. Once MathJax has typeset the page (and again when the window is resized),
 * such a formula gets the class `course-wide-math`, which puts it on a line of its own that
 * scrolls sideways (docs/_static/course.css); the page's <html> then gets
 * data-course-math="fitted". tests/test_site.py checks both in Chromium.
 */
(function () {
  "use strict";

  function closeViewer() {
    const viewer = document.querySelector(".course-figure-viewer");
    if (viewer) {
      viewer.remove();
      document.documentElement.style.overflow = "";
    }
  }

  function openViewer(link, img) {
    closeViewer();
    const viewer = document.createElement("div");
    viewer.className = "course-figure-viewer";
    viewer.setAttribute("role", "dialog");
    viewer.setAttribute("aria-modal", "true");
    viewer.setAttribute("aria-label", "The figure at full size");
    const close = document.createElement("button");
    close.type = "button";
    close.textContent = "✕ close";
    close.setAttribute("aria-label", "Close the full-size figure");
    const full = document.createElement("img");
    full.src = link.href;
    full.alt = img.alt;
    viewer.append(close, full);
    viewer.addEventListener("click", closeViewer);
    document.body.append(viewer);
    document.documentElement.style.overflow = "hidden";
    close.focus();
  }

  function linkFigures() {
    document.querySelectorAll(".bd-article img").forEach(function (img) {
      if (img.closest("a")) return;
      const link = document.createElement("a");
      link.className = "course-figure-link";
      link.href = img.currentSrc || img.src;
      link.title = "Open the figure at full size";
      img.replaceWith(link);
      link.append(img);
      link.addEventListener("click", function (event) {
        if (event.ctrlKey || event.metaKey || event.shiftKey || event.button !== 0) return;
        event.preventDefault();
        openViewer(link, img);
      });
    });
  }

  function fitWideMath() {
    document.querySelectorAll('.bd-article mjx-container:not([display="true"])').forEach(function (math) {
      math.classList.remove("course-wide-math");
      const block = math.parentElement.closest("p, li, dd, td, th, div, section");
      if (block && math.getBoundingClientRect().width > block.clientWidth) {
        math.classList.add("course-wide-math");
      }
    });
    document.documentElement.dataset.courseMath = "fitted";
  }

  function watchMath() {
    if (!(window.MathJax && MathJax.startup && MathJax.startup.promise)) return;
    MathJax.startup.promise.then(function () { return document.fonts.ready; }).then(fitWideMath);
    let pending = null;
    window.addEventListener("resize", function () {
      clearTimeout(pending);
      pending = setTimeout(fitWideMath, 100);
    });
  }

  document.addEventListener("keydown", function (event) {
    if (event.key === "Escape") closeViewer();
  });
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", linkFigures);
  } else {
    linkFigures();
  }
  // MathJax is loaded with `defer`, after this script: it exists once the page has loaded.
  if (document.readyState === "complete") {
    watchMath();
  } else {
    window.addEventListener("load", watchMath);
  }
})();
