// Shared by the admin pages: the key field, the status line, and calls to the admin API.
// The pages hold no data; everything comes from the API with the key the person types in.
const keyInput = document.getElementById("key");
const statusLine = document.getElementById("status");

function show(message, isError) {
  statusLine.textContent = message;
  statusLine.className = isError ? "error" : "";
}

async function api(path, options) {
  const response = await fetch(path, {
    ...options,
    headers: {"Authorization": "Bearer " + keyInput.value, "Content-Type": "application/json"},
  });
  const body = await response.json();
  if (!response.ok) throw new Error(body.error ? body.error.message : response.statusText);
  return body;
}
