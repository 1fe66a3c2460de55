// The microphone page of ssm-serve: capture (AudioWorklet, 16 kHz), stream to /asr, show partial text, segments
// with their times and the final transcript; say so when the microphone is refused or the server goes away.
"use strict";

const $ = (id) => document.getElementById(id);
let session = null;  // {socket, context, stream, node, finished}

function status(text) { $("status").textContent = text; }

function showError(text) {
  $("error").textContent = text;
  $("error").hidden = false;
}

function seconds(value) { return value.toFixed(2); }

function addSegment(segment) {
  const item = document.createElement("li");
  const times = document.createElement("span");
  times.className = "times";
  times.textContent = `${seconds(segment.start)}–${seconds(segment.end)} s`;
  item.append(times, document.createTextNode(segment.text));
  $("segments").append(item);
}

function onResult(result) {
  if (result.error !== undefined) {
    showError(`Server error (${result.code}): ${result.error}`);
    return;
  }
  if (result.final) {
    $("segments").replaceChildren();
    result.segments.filter((s) => s.text).forEach(addSegment);
    $("partial").textContent = "";
    $("final").textContent = result.text;
    $("final").dataset.done = "true";
    status("Done.");
  } else if (result.is_final) {
    addSegment(result);
    $("partial").textContent = "";
  } else {
    $("partial").textContent = result.text;
  }
}

function microphoneProblem(error) {
  if (error.name === "NotAllowedError" || error.name === "SecurityError") {
    return "Microphone access was refused. Allow the microphone for this page (the icon in the address bar) " +
      "and press Start again.";
  }
  if (error.name === "NotFoundError" || error.name === "OverconstrainedError") {
    return "No microphone was found. Connect one and press Start again.";
  }
  return `The microphone could not be opened: ${error.name}: ${error.message}`;
}

async function openAudio(stream) {
  // A 16 kHz context lets the browser resample; where the browser refuses to mix rates, the default rate and the
  // worklet's own resampler.
  for (const options of [{ sampleRate: 16000 }, {}]) {
    const context = new AudioContext(options);
    try {
      await context.audioWorklet.addModule("/static/capture-worklet.js");
      const source = context.createMediaStreamSource(stream);
      const node = new AudioWorkletNode(context, "capture-16k", { numberOfOutputs: 1 });
      source.connect(node);
      node.connect(context.destination);  // pulled by the graph; the node outputs silence
      return { context, node };
    } catch (error) {
      await context.close();
      if (options.sampleRate === undefined) throw error;
    }
  }
}

async function start() {
  $("error").hidden = true;
  $("segments").replaceChildren();
  $("partial").textContent = "";
  $("final").textContent = "";
  delete $("final").dataset.done;
  if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
    showError("This browser gives the microphone only to pages served over https or from localhost: open the " +
      "page at http://localhost:PORT/ or serve it over https.");
    return;
  }
  $("start").disabled = true;
  status("Asking for the microphone…");
  let stream;
  try {
    stream = await navigator.mediaDevices.getUserMedia({
      audio: { channelCount: 1, echoCancellation: false, noiseSuppression: false, autoGainControl: false },
    });
  } catch (error) {
    showError(microphoneProblem(error));
    status("Stopped.");
    $("start").disabled = false;
    return;
  }
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const socket = new WebSocket(`${scheme}//${location.host}/asr`);
  socket.binaryType = "arraybuffer";
  session = { socket, stream, finished: false, context: null, node: null };
  const current = session;
  socket.onmessage = (event) => {
    if (typeof event.data !== "string" || event.data === "Done!") return;
    const result = JSON.parse(event.data);
    if (result.final) current.finished = true;
    onResult(result);
  };
  socket.onclose = (event) => {
    stopAudio(current);
    if (!current.finished) {
      showError(`The connection to the server was lost (code ${event.code}${event.reason ? ": " + event.reason : ""}). ` +
        "Is ssm-serve still running? Press Start to try again.");
      status("Stopped.");
    }
    $("start").disabled = false;
    $("stop").disabled = true;
    if (session === current) session = null;
  };
  socket.onopen = async () => {
    socket.send(JSON.stringify({ timestamps: true }));
    try {
      const { context, node } = await openAudio(stream);
      current.context = context;
      current.node = node;
      node.port.onmessage = (event) => {
        if (event.data instanceof Float32Array) {
          if (event.data.length && socket.readyState === WebSocket.OPEN) socket.send(event.data.buffer);
        } else if (event.data === "flushed") {
          stopAudio(current);
          if (socket.readyState === WebSocket.OPEN) socket.send("Done");
        }
      };
      status("Listening…");
      $("stop").disabled = false;
    } catch (error) {
      showError(`Audio capture could not start: ${error.message}`);
      socket.close();
    }
  };
}

function stopAudio(current) {
  if (current.stream) current.stream.getTracks().forEach((track) => track.stop());
  if (current.context && current.context.state !== "closed") current.context.close();
}

function stop() {
  const current = session;
  if (!current) return;
  $("stop").disabled = true;
  status("Finishing…");
  if (current.node) current.node.port.postMessage("flush");  // the last samples, then Done
  else current.socket.send("Done");
}

$("start").addEventListener("click", start);
$("stop").addEventListener("click", stop);
