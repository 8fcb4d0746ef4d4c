// agent-cli-gateway dashboard: live updates over server-sent events, and a confirmation
// before each action. Written for this project (no framework, no build step); the page's
// Content-Security-Policy allows only this file as script.
"use strict";

// Remove ?token=... if a page was somehow reached with it (the server redirects it away).
(function dropToken() {
  const url = new URL(window.location.href);
  if (url.searchParams.has("token")) {
    url.searchParams.delete("token");
    window.history.replaceState(null, "", url.pathname + url.search + url.hash);
  }
})();

function confirmActions() {
  for (const form of document.querySelectorAll("form[data-confirm]")) {
    form.addEventListener("submit", (event) => {
      if (!window.confirm(form.dataset.confirm)) {
        event.preventDefault();
      }
    });
  }
}

// The jobs table: the server sends the rows as HTML it rendered and escaped itself.
function liveRows() {
  const body = document.getElementById("job-rows");
  if (!body || !body.dataset.live) {
    return;
  }
  const source = new EventSource(body.dataset.live);
  source.addEventListener("rows", (event) => {
    body.innerHTML = event.data;
    body.dataset.updated = String(Date.now());
  });
}

// One job: its status block (server-rendered HTML), and its output as text.
function liveJob() {
  const status = document.getElementById("job-status");
  if (!status || !status.dataset.live) {
    return;
  }
  const tail = document.getElementById("tail");
  const notes = document.getElementById("tail-notes");
  const source = new EventSource(status.dataset.live);
  source.addEventListener("status", (event) => {
    status.innerHTML = event.data;
  });
  source.addEventListener("tail", (event) => {
    if (tail) {
      tail.append(document.createTextNode(JSON.parse(event.data)));
      tail.scrollTop = tail.scrollHeight;
    }
  });
  source.addEventListener("note", (event) => {
    if (notes) {
      notes.textContent = JSON.parse(event.data);
    }
  });
  source.addEventListener("end", () => {
    source.close();
    status.dataset.ended = "true";
    // The finished job's page shows its answer, usage and changes.
    window.setTimeout(() => window.location.reload(), 1500);
  });
}

document.addEventListener("DOMContentLoaded", () => {
  confirmActions();
  liveRows();
  liveJob();
});
