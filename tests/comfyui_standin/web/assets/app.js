// As ComfyUI's frontend: the page's own URLs are relative, but the progress favicon's frames are
// named from the site root.
const defaultFavicon = '/assets/images/favicon_progress_16x16/frame_9.png'
const frame = (n) => `/assets/images/favicon_progress_16x16/frame_${n}.png`
function setFavicon(href) {
  document.querySelector("link[rel=icon]").href = href
}
const url = new URL("ws", location.href)
url.protocol = url.protocol === "https:" ? "wss:" : "ws:"
const ws = new WebSocket(url)
ws.binaryType = "arraybuffer"
let frames = 0
ws.onmessage = (ev) => {
  if (typeof ev.data !== "string") {
    frames += 1
    setFavicon(frame(frames % 10))
    document.getElementById("ws").textContent = "websocket: binary frames " + frames
  }
}
setFavicon(defaultFavicon)
