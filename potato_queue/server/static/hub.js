// A run's page: publish its model to the Hugging Face Hub, and follow the upload (it goes on in the server).
"use strict";
(function () {
  const run = document.getElementById("run").dataset.run;
  const path = "/runs/" + run + "/publish";
  const box = document.getElementById("hub"), form = document.getElementById("hub-form");
  const said = document.getElementById("hub-state"), problem = document.getElementById("hub-problem");

  function showHub(hub) {
    if (!hub) { said.replaceChildren(); return; }
    const where = hub.repo_id + (hub.private ? " (private)" : " (public)");
    if (hub.state === "publishing") said.replaceChildren(el("span", {text: "Publishing to " + where + "…"}));
    else if (hub.state === "published") {
      said.replaceChildren(el("span", {text: "Published to "}), el("a", {href: hub.url, rel: "noopener", text: hub.url}),
        el("span", {text: " " + (hub.private ? "(private)" : "(public)") + ", revision " + hub.revision}));
    } else said.replaceChildren(el("span", {class: "problem", text: "Publishing to " + where + " failed: " + hub.error}));
  }

  function show(status) {
    box.hidden = status.state !== "succeeded";
    const refused = document.getElementById("hub-refused");
    refused.hidden = !status.refused;
    refused.textContent = status.refused ? status.refused.message + "; fix: " + status.refused.fix : "";
    form.hidden = Boolean(status.refused);
    const busy = Boolean(status.hub && status.hub.state === "publishing");
    document.getElementById("hub-publish").disabled = busy;
    showHub(status.hub);
    return busy;
  }

  let timer = null;
  function pollIn(ms) { clearTimeout(timer); timer = setTimeout(poll, ms); }

  async function poll() {
    let busy = false;
    try { busy = show(await api(path)); } catch (err) { problem.textContent = err.message; }
    pollIn(busy ? 1000 : 5000);
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    problem.textContent = "";
    const token = document.getElementById("hub-token");
    const body = {repo_id: document.getElementById("hub-repo").value.trim(),
      private: document.getElementById("hub-private").checked, token: token.value || null};
    token.value = "";  // used for this upload only: not kept in the page either
    try {
      show(await api(path, {method: "POST", body: JSON.stringify(body)}));
      pollIn(1000);
    } catch (err) { problem.textContent = err.message; }
  });

  poll();
})();
