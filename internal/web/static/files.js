// Drover dashboard: the device page's upload (docs/remote-access.md). The
// chosen file is the body of PUT devices/{id}/files?path=…, with the
// session's CSRF token in a header; the answer (the device's SHA-256 of
// what it wrote, or the refusal) is shown next to the button.
(function () {
  "use strict";
  var form = document.getElementById("upload");
  if (!form) return;
  var file = document.getElementById("upload-file");
  var dest = document.getElementById("upload-path");
  var button = document.getElementById("upload-send");
  var status = document.getElementById("upload-status");

  function say(msg, error) {
    status.textContent = msg;
    status.classList.toggle("error", !!error);
  }

  form.addEventListener("submit", function (ev) {
    ev.preventDefault();
    var f = file.files && file.files[0];
    if (!f) return;
    var path = dest.value;
    if (path.charAt(path.length - 1) === "/") path += f.name;
    button.disabled = true;
    say("Uploading " + f.name + " (" + f.size + " bytes)…");
    fetch(form.getAttribute("data-path") + "?path=" + encodeURIComponent(path), {
      method: "PUT", body: f, credentials: "same-origin",
      headers: { "Content-Type": "application/octet-stream", "X-CSRF-Token": form.getAttribute("data-csrf") }
    }).then(function (resp) {
      return resp.json().then(function (body) {
        if (!resp.ok) throw new Error(body && body.error ? body.error.message + " (" + body.error.code + ")" : "the server answered " + resp.status);
        say("Uploaded to " + body.path + ": " + body.size + " bytes, SHA-256 " + body.sha256 + ".");
      }, function () { throw new Error("the server answered " + resp.status); });
    }, function () {
      // The server answers a refusal before it reads the body and
      // closes the connection; a browser still sending may see only that.
      throw new Error("the connection ended before the server's answer; the device may have refused " + path +
        " (outside its --files-allow, or over its --files-max-size)");
    }).catch(function (err) {
      say("The upload failed: " + err.message, true);
    }).then(function () {
      button.disabled = false;
    });
  });
})();
