// Drover dashboard: small progressive enhancements. Every page works
// without this script.
(function () {
  "use strict";

  // Confirm destructive forms (data-confirm).
  document.querySelectorAll("form[data-confirm]").forEach(function (f) {
    f.addEventListener("submit", function (e) {
      if (!window.confirm(f.getAttribute("data-confirm"))) e.preventDefault();
    });
  });

  // Check JSON in textareas marked data-json="object" while typing; the
  // server validates again on save.
  document.querySelectorAll("textarea[data-json]").forEach(function (ta) {
    var out = document.getElementById("jsonerror");
    var save = ta.form && ta.form.querySelector("button[type=submit]");
    function check() {
      var msg = "";
      try {
        var v = JSON.parse(ta.value);
        if (v === null || typeof v !== "object" || Array.isArray(v)) msg = "The configuration must be a JSON object.";
      } catch (err) {
        msg = "Not valid JSON: " + err.message;
      }
      if (out) {
        out.textContent = msg;
        out.classList.toggle("hidden", msg === "");
      }
      if (save) save.disabled = msg !== "";
    }
    ta.addEventListener("input", check);
    check();
  });

  // Refresh the overview's status light and counts every 10 s.
  var status = document.getElementById("status");
  if (status) {
    var src = status.getAttribute("data-src");
    var names = { green: "Healthy", yellow: "Attention", red: "Service problem" };
    var fmt = function (n) { return n.toLocaleString("en-US"); };
    setInterval(function () {
      fetch(src, { credentials: "same-origin" }).then(function (r) {
        if (!r.ok) throw new Error(r.status);
        return r.json();
      }).then(function (s) {
        ["status", "statuslight", "navlight"].forEach(function (id) {
          var el = document.getElementById(id);
          if (el) el.className = el.className.replace(/\b(green|yellow|red)\b/, s.level);
        });
        document.getElementById("statuslevel").textContent = names[s.level];
        var ul = document.getElementById("statusreasons");
        ul.textContent = "";
        s.reasons.forEach(function (t) {
          var li = document.createElement("li");
          li.textContent = t;
          ul.appendChild(li);
        });
        document.getElementById("devtotal").textContent = fmt(s.devices);
        document.querySelectorAll("[data-sync]").forEach(function (td) { td.textContent = fmt(s.sync[td.getAttribute("data-sync")]); });
        document.querySelectorAll("[data-live]").forEach(function (td) { td.textContent = fmt(s.liveness[td.getAttribute("data-live")]); });
      }).catch(function () { /* keep the last values; the next tick retries */ });
    }, 10000);
  }
})();
