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
 * data-course-math="fitted".
 *
 * A table wider than its column (the syllabus on a phone, a printed table that docs/stage_site.py
 * made a table) becomes a stack of cards, one per row, each cell a "header: value" line (class
 * `course-stacked`, docs/_static/course.css), so that no number hides beyond the right edge.
 *
 * "Back to top" sits in the header bar (docs/_templates/back-to-top.html); it shows once the reader
 * is a screen or more down the page, at every width. tests/test_site.py checks all of this in Chromium.
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
      let block = math.parentElement.closest("p, li, dd, td, th, div, section");
      // A paragraph made inline (in a table's card) has no width of its own: measure its box.
      while (block && getComputedStyle(block).display === "inline") {
        block = block.parentElement.closest("p, li, dd, td, th, div, section");
      }
      if (block && math.getBoundingClientRect().width > block.clientWidth) {
        math.classList.add("course-wide-math");
      }
    });
    document.documentElement.dataset.courseMath = "fitted";
  }

  function labelTables() {
    document.querySelectorAll(".bd-article table").forEach(function (table) {
      const head = table.tHead && table.tHead.rows[0];
      if (!head) return;
      const names = Array.from(head.cells).map(function (cell) { return cell.textContent.trim(); });
      Array.from(table.tBodies).forEach(function (body) {
        Array.from(body.rows).forEach(function (row) {
          Array.from(row.cells).forEach(function (cell, k) {
            if (names[k]) cell.dataset.label = names[k];
            if (!cell.textContent.trim() && !cell.querySelector("img, mjx-container")) cell.classList.add("course-empty");
          });
        });
      });
      table.classList.add("course-stackable");
    });
  }

  function fitTables() {
    document.querySelectorAll(".bd-article table.course-stackable").forEach(function (table) {
      table.classList.remove("course-stacked");
      if (table.getBoundingClientRect().width > table.parentElement.clientWidth + 1) {
        table.classList.add("course-stacked");
      }
    });
  }

  function showBackToTop() {
    const button = document.getElementById("pst-back-to-top");
    if (!button) return;
    let pending = false;
    function update() {
      pending = false;
      button.classList.toggle("course-shown", window.scrollY > window.innerHeight);
    }
    function later() {
      if (!pending) {
        pending = true;
        requestAnimationFrame(update);
      }
    }
    window.addEventListener("scroll", later, { passive: true });
    window.addEventListener("resize", later);
    update();
  }

  function fitPage() {
    fitTables();
    fitWideMath();
  }

  function watchLayout() {
    let pending = null;
    window.addEventListener("resize", function () {
      clearTimeout(pending);
      pending = setTimeout(fitPage, 100);
    });
    // Typeset formulas (in a table cell, too) change widths: fit again once they are in.
    const typeset = window.MathJax && MathJax.startup && MathJax.startup.promise;
    (typeset || Promise.resolve()).then(function () { return document.fonts.ready; }).then(fitPage);
  }

  document.addEventListener("keydown", function (event) {
    if (event.key === "Escape") closeViewer();
  });
  function prepare() {
    linkFigures();
    labelTables();
    fitTables();
    showBackToTop();
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", prepare);
  } else {
    prepare();
  }
  // MathJax is loaded with `defer`, after this script: it exists once the page has loaded.
  if (document.readyState === "complete") {
    watchLayout();
  } else {
    window.addEventListener("load", watchLayout);
  }
})();
