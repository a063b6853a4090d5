// Drover dashboard: the device page's terminal (docs/remote-access.md).
// xterm.js (static/xterm/) on a WebSocket to the page's
// devices/{id}/terminal: binary messages are the terminal's bytes both
// ways, text messages JSON ({"type":"resize"} out, {"type":"exit"} in).
(function () {
  "use strict";
  var box = document.getElementById("terminal");
  var button = document.getElementById("terminal-open");
  var status = document.getElementById("terminal-status");
  if (!box || !button || !window.Terminal) return;

  // xterm.js's DOM renderer writes its theme and cell sizes into <style>
  // elements, which the dashboard's Content-Security-Policy (style-src
  // 'self') refuses. It gets constructed style sheets instead: inert
  // elements whose text goes to a sheet adopted by the document (CSSOM,
  // which style-src does not govern).
  if (document.adoptedStyleSheets && window.CSSStyleSheet) {
    var create = document.createElement;
    document.createElement = function (tag, options) {
      if (String(tag).toLowerCase() !== "style") return create.call(document, tag, options);
      var el = create.call(document, "template");
      var sheet = new CSSStyleSheet();
      var text = "";
      document.adoptedStyleSheets = document.adoptedStyleSheets.concat([sheet]);
      Object.defineProperty(el, "textContent", {
        get: function () { return text; },
        set: function (v) { text = String(v); sheet.replaceSync(text); }
      });
      el.remove = function () {
        document.adoptedStyleSheets = document.adoptedStyleSheets.filter(function (s) { return s !== sheet; });
        Element.prototype.remove.call(el);
      };
      return el;
    };
  }

  function say(msg, error) {
    status.textContent = msg;
    status.classList.toggle("error", !!error);
  }

  var term = null;
  button.addEventListener("click", function () {
    button.disabled = true;
    if (!term) {
      term = new window.Terminal({ cursorBlink: true, fontSize: 14, scrollback: 5000 });
      var fit = window.FitAddon ? new window.FitAddon.FitAddon() : null;
      if (fit) term.loadAddon(fit);
      box.classList.remove("hidden");
      term.open(box);
      if (fit) {
        fit.fit();
        window.addEventListener("resize", function () { fit.fit(); });
      }
    } else {
      term.reset();
    }
    var path = box.getAttribute("data-path") + "?cols=" + term.cols + "&rows=" + term.rows;
    say("Connecting…");
    // Check first: a refused WebSocket tells the page nothing, this
    // request's answer says why.
    fetch(path, { credentials: "same-origin" }).then(function (resp) {
      return resp.json().then(function (body) {
        if (!resp.ok) throw new Error(body && body.error ? body.error.message + " (" + body.error.code + ")" : resp.statusText);
      }, function () { throw new Error("the server answered " + resp.status); });
    }).then(function () {
      connect(path);
    }).catch(function (err) {
      say("The terminal could not be opened: " + err.message, true);
      button.disabled = false;
    });
  });

  function connect(path) {
    var ws = new WebSocket((location.protocol === "https:" ? "wss://" : "ws://") + location.host + path);
    ws.binaryType = "arraybuffer";
    var enc = new TextEncoder();
    var subs = [];
    var ended = "";
    ws.onopen = function () {
      say("Connected: a shell on the device. Every session is in the audit log.");
      subs.push(term.onData(function (d) { if (ws.readyState === 1) ws.send(enc.encode(d)); }));
      subs.push(term.onResize(function (s) {
        if (ws.readyState === 1) ws.send(JSON.stringify({ type: "resize", cols: s.cols, rows: s.rows }));
      }));
      term.focus();
    };
    ws.onmessage = function (e) {
      if (typeof e.data === "string") {
        var m = JSON.parse(e.data);
        if (m.type === "exit") ended = "The shell exited with status " + m.status + ".";
        return;
      }
      term.write(new Uint8Array(e.data));
    };
    ws.onclose = function (e) {
      subs.forEach(function (s) { s.dispose(); });
      say(ended || "The session ended" + (e.reason ? ": " + e.reason : "") + ".", !ended && e.code !== 1000);
      button.disabled = false;
      button.textContent = "Open a new terminal";
    };
  }
})();
