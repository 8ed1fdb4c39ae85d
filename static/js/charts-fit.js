/* Charts on a phone. The server lays each plotly chart out for a desktop card: a one-line title
   and two-line shape labels. In a card under 600 px wide the title runs past the card's edge
   and plotly turns crowded tick labels on their side, clipping them. Here each chart is fitted
   to the width it has: a title wider than the chart wrapped into lines that fit (the chart
   grows by those lines) and, on a phone, tick labels smaller and upright. With room again,
   the server's layout is put back. */
(function () {
  "use strict";

  var NARROW_PX = 600;
  var TITLE_CHAR_PX = 7; // a character of the 14 px title font, where none was drawn to measure
  var LINE_PX = 18;

  function wrapWords(text, perLine) {
    var lines = [];
    var line = "";
    text.split(" ").forEach(function (word) {
      if (line && (line + " " + word).length > perLine) {
        lines.push(line);
        line = word;
      } else {
        line = line ? line + " " + word : word;
      }
    });
    if (line) lines.push(line);
    return lines;
  }

  function fit(div) {
    if (!window.Plotly || !div.layout || !div.data || !div.clientWidth) return;
    var layout = div.layout;
    if (div.dataset.fitTitle === undefined) {
      // The server's layout, kept once, to put back when the chart has room again; and the
      // title's drawn width in one line, to know how many characters a line holds.
      var drawn = div.querySelector(".gtitle");
      div.dataset.fitTitle = (layout.title && layout.title.text) || "";
      div.dataset.fitTitlePx = drawn ? drawn.getBoundingClientRect().width : 0;
      div.dataset.fitTop = (layout.margin && layout.margin.t) || 40;
      div.dataset.fitHeight = layout.height || div.clientHeight || 360;
    }
    var title = div.dataset.fitTitle;
    var titlePx = Number(div.dataset.fitTitlePx);
    var top = Number(div.dataset.fitTop);
    var height = Number(div.dataset.fitHeight);
    var room = div.clientWidth - 24;
    var phone = window.innerWidth < NARROW_PX;
    var lines = [title];
    if (title && titlePx > room) {
      var charPx = titlePx / title.length || TITLE_CHAR_PX;
      lines = wrapWords(title, Math.max(12, Math.floor(room / charPx)));
    }
    var state = lines.length + (phone ? "phone" : "wide") + div.clientWidth;
    if (div.dataset.fitState === state) return;
    div.dataset.fitState = state;
    var extra = (lines.length - 1) * LINE_PX;
    var update = {
      "title.text": lines.join("<br>"),
      "margin.t": top + extra,
      height: height + extra,
    };
    // On a phone, tick labels a size smaller and upright (plotly turns crowded ones sideways,
    // where a two-line shape label is clipped).
    update["xaxis.tickangle"] = phone ? 0 : "auto";
    update["xaxis.tickfont.size"] = phone ? 9 : null;
    update["yaxis.tickfont.size"] = phone ? 10 : null;
    window.Plotly.relayout(div, update);
  }

  function fitAll() {
    document.querySelectorAll(".js-plotly-plot").forEach(fit);
  }

  var pending = null;
  function fitSoon() {
    clearTimeout(pending);
    pending = setTimeout(fitAll, 120);
  }

  document.addEventListener("DOMContentLoaded", fitAll);
  window.addEventListener("load", fitAll);
  window.addEventListener("resize", fitSoon);
  // The job page fetches its charts again as a job advances (htmx swaps the card).
  document.addEventListener("htmx:afterSettle", fitAll);
  window.ptxfFitCharts = fitAll;
})();
