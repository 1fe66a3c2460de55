// The microphone's samples, at the AudioContext's rate, -> 16 kHz mono float32 chunks posted to the page.
// At 16 kHz the samples pass through unchanged; at another rate they are low-pass filtered below 8 kHz (a
// windowed-sinc FIR at the input rate) and read at 16 kHz by linear interpolation between filtered samples. Samples
// are clipped to [-1, 1] (the browser's own resampling, or this one, overshoots a full-scale signal slightly).
const OUTPUT_RATE = 16000;
const CHUNK = 1600;  // 100 ms per message
const TAPS = 63;

function lowPass(cutoff) {  // cutoff: a fraction of the input rate
  const taps = new Float32Array(TAPS), middle = (TAPS - 1) / 2;
  let sum = 0;
  for (let i = 0; i < TAPS; i++) {
    const x = i - middle;
    const sinc = x === 0 ? 2 * cutoff : Math.sin(2 * Math.PI * cutoff * x) / (Math.PI * x);
    const blackman = 0.42 - 0.5 * Math.cos(2 * Math.PI * i / (TAPS - 1)) + 0.08 * Math.cos(4 * Math.PI * i / (TAPS - 1));
    taps[i] = sinc * blackman;
    sum += taps[i];
  }
  return taps.map(t => t / sum);
}

class Capture16k extends AudioWorkletProcessor {
  constructor() {
    super();
    this.step = sampleRate / OUTPUT_RATE;  // input samples per output sample
    this.resampling = sampleRate !== OUTPUT_RATE;
    if (this.resampling) {
      this.taps = lowPass(0.45 * OUTPUT_RATE / sampleRate);
      this.history = new Float32Array(TAPS);  // the last TAPS input samples, a ring
      this.at = 0;  // ring position of the next input sample
      this.previous = 0;  // the filtered sample before the current one
      this.position = 0;  // where the next output sample falls, in input samples after `previous`
    }
    this.chunk = new Float32Array(CHUNK);
    this.filled = 0;
    this.port.onmessage = (event) => {
      if (event.data === "flush") {
        this.port.postMessage(this.chunk.slice(0, this.filled));
        this.filled = 0;
        this.port.postMessage("flushed");
      }
    };
  }

  emit(sample) {  // clipped to [-1, 1], which the protocol takes: resampling overshoots a full-scale signal
    this.chunk[this.filled++] = Math.max(-1, Math.min(1, sample));
    if (this.filled === CHUNK) {
      this.port.postMessage(this.chunk.slice());
      this.filled = 0;
    }
  }

  filtered(sample) {  // one input sample in -> the FIR output at it
    this.history[this.at] = sample;
    this.at = (this.at + 1) % TAPS;
    let sum = 0;
    for (let i = 0; i < TAPS; i++) sum += this.taps[i] * this.history[(this.at + i) % TAPS];
    return sum;
  }

  process(inputs) {
    const channels = inputs[0];
    if (!channels || channels.length === 0) return true;
    const samples = channels[0];  // the first channel: the page asks for mono
    for (let i = 0; i < samples.length; i++) {
      if (!this.resampling) { this.emit(samples[i]); continue; }
      const current = this.filtered(samples[i]);
      while (this.position <= 1) {  // output samples between `previous` and `current`
        this.emit(this.previous + (current - this.previous) * this.position);
        this.position += this.step;
      }
      this.position -= 1;
      this.previous = current;
    }
    return true;
  }
}

registerProcessor("capture-16k", Capture16k);
