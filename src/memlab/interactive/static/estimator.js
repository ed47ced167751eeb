/* memlab memory estimator (chapter 1, "Where the memory goes").
 *
 * memlab.memory.estimate for a training step, in the browser, with no kernel and no
 * dependency: the same parameter tensors, the same saved tensors block by block, the same
 * peak per phase (forward, backward with its walk through the last and first blocks,
 * optimizer). This file holds only that arithmetic and the page's controls. Every number it
 * multiplies by comes from Python as JSON (memlab.interactive.estimator.estimator_data): the
 * bytes of each dtype, the bytes of parameters and of matmul outputs per precision,
 * bitsandbytes' block size, the presets' shapes, each GPU's usable bytes, the table that reads
 * a Hugging Face config.json. Tests run it in Chromium against memlab.memory.estimate.
 *
 * Exposed as globalThis.memlabEstimator (and module.exports under Node):
 *   estimate(cfg, setting, K)      -> {parameters, phases, peak_phase, breakdown, ...} (bytes)
 *   configFromHF(raw, K, source)   -> a resolved config, or throws {memlab: true, message}
 *   readout(cfg, setting, K)       -> what the page shows: texts and bytes (or {error})
 *   pyFixed(x, digits), pyRepr(v)  numbers and values written as Python writes them
 *   mount(rootElement, K)          binds one estimator rendered by memlab.interactive.estimator
 *   mountById(id)                  the same, finding the root and its JSON data by id
 */
(function (root, factory) {
  "use strict";
  var api = factory();
  if (typeof module === "object" && module && module.exports) {
    module.exports = api;
  }
  if (root) {
    root.memlabEstimator = api;
  }
})(typeof globalThis !== "undefined" ? globalThis : typeof window !== "undefined" ? window : this, function () {
  "use strict";

  var VERSION = 1;

  function MemlabError(message) {
    this.memlab = true;
    this.message = message;
  }

  function fail(message) {
    throw new MemlabError(message);
  }

  function sum(xs) {
    var s = 0;
    for (var i = 0; i < xs.length; i++) {
      s += xs[i];
    }
    return s;
  }

  /* ---- numbers and values as Python writes them ------------------------------------ */

  var view = new DataView(new ArrayBuffer(8));

  /* format(x, ",.<digits>f") of a finite double: its exact value, rounded half to even. */
  function pyFixed(x, digits) {
    var negative = x < 0 || (x === 0 && 1 / x < 0);
    view.setFloat64(0, Math.abs(x));
    var hi = view.getUint32(0);
    var lo = view.getUint32(4);
    var biased = (hi >>> 20) & 0x7ff;
    var two = BigInt(2);
    var ten = BigInt(10);
    var m = BigInt(hi & 0xfffff) * two ** BigInt(32) + BigInt(lo); // fraction bits
    var e;
    if (biased === 0) {
      e = -1074; // subnormal (or zero)
    } else {
      m += two ** BigInt(52);
      e = biased - 1075;
    }
    var scale = ten ** BigInt(digits);
    var q;
    if (e >= 0) {
      q = m * two ** BigInt(e) * scale;
    } else {
      var den = two ** BigInt(-e);
      var num = m * scale;
      q = num / den;
      var r2 = (num % den) * two;
      if (r2 > den || (r2 === den && q % two === BigInt(1))) {
        q += BigInt(1);
      }
    }
    var s = q.toString();
    while (s.length <= digits) {
      s = "0" + s;
    }
    var whole = s.slice(0, s.length - digits);
    var frac = s.slice(s.length - digits);
    return (negative ? "-" : "") + groupThousands(whole) + (digits > 0 ? "." + frac : "");
  }

  /* "1234567" -> "1,234,567" (Python's "," format). */
  function groupThousands(digitsText) {
    var out = "";
    for (var i = 0; i < digitsText.length; i++) {
      if (i > 0 && (digitsText.length - i) % 3 === 0) {
        out += ",";
      }
      out += digitsText.charAt(i);
    }
    return out;
  }

  function intText(n) {
    return groupThousands(String(n));
  }

  /* A float as Python's repr() writes it: shortest round trip, 'e' below 1e-4 and from 1e16. */
  function floatRepr(x) {
    if (x !== x) {
      return "nan";
    }
    if (x === Infinity || x === -Infinity) {
      return x > 0 ? "inf" : "-inf";
    }
    if (x === 0) {
      return 1 / x < 0 ? "-0.0" : "0.0";
    }
    var sign = x < 0 ? "-" : "";
    var parts = Math.abs(x).toExponential().split("e");
    var digits = parts[0].replace(".", "");
    var exp = parseInt(parts[1], 10);
    if (exp < -4 || exp >= 16) {
      var mant = digits.charAt(0) + (digits.length > 1 ? "." + digits.slice(1) : "");
      var es = String(Math.abs(exp));
      return sign + mant + "e" + (exp < 0 ? "-" : "+") + (es.length < 2 ? "0" + es : es);
    }
    if (exp < 0) {
      return sign + "0." + new Array(-exp).join("0") + digits;
    }
    if (digits.length <= exp + 1) {
      return sign + digits + new Array(exp + 2 - digits.length).join("0") + ".0";
    }
    return sign + digits.slice(0, exp + 1) + "." + digits.slice(exp + 1);
  }

  /* A parsed JSON value as Python's repr() writes it (integral numbers as ints). */
  function pyRepr(v) {
    if (v === null || v === undefined) {
      return "None";
    }
    if (v === true || v === false) {
      return v ? "True" : "False";
    }
    if (typeof v === "number") {
      return Number.isInteger(v) && Math.abs(v) < Number.MAX_SAFE_INTEGER ? String(v) : floatRepr(v);
    }
    if (typeof v === "string") {
      var quote = v.indexOf("'") >= 0 && v.indexOf('"') < 0 ? '"' : "'";
      var out = "";
      for (var i = 0; i < v.length; i++) {
        var ch = v.charAt(i);
        var code = v.charCodeAt(i);
        if (ch === "\\" || ch === quote) {
          out += "\\" + ch;
        } else if (ch === "\n") {
          out += "\\n";
        } else if (ch === "\r") {
          out += "\\r";
        } else if (ch === "\t") {
          out += "\\t";
        } else if (code < 0x20 || code === 0x7f) {
          out += "\\x" + (code < 0x10 ? "0" : "") + code.toString(16);
        } else {
          out += ch;
        }
      }
      return quote + out + quote;
    }
    if (Array.isArray(v)) {
      return "[" + v.map(pyRepr).join(", ") + "]";
    }
    return "{" + Object.keys(v).map(function (k) {
      return pyRepr(k) + ": " + pyRepr(v[k]);
    }).join(", ") + "}";
  }

  /* ---- parameters, gradients, optimizer states (memlab.memory.training) ------------- */

  /* The parameter tensors: the embeddings (once), one block's (n_layer times), the head's
     (once; a tied head is the embedding). Each block tensor is [part, elements, is a Linear
     weight]; parts: norm1, qkv, o, norm2, mlp_in (gate and up, or GPT-2's up), down. */
  function paramGroups(cfg) {
    var C = cfg.d_model;
    var F = cfg.ffn_dim;
    var V = cfg.vocab_size;
    var kv = cfg.kv_heads * cfg.head_dim;
    var embed;
    var block;
    var head;
    if (cfg.style === "gpt2") { // LayerNorms and Linears with biases, learned positions
      embed = [V * C, cfg.max_seq_len * C];
      block = [["norm1", C, false], ["norm1", C, false],
               ["qkv", C * C, true], ["qkv", C, false], ["qkv", C * kv, true], ["qkv", kv, false],
               ["qkv", C * kv, true], ["qkv", kv, false],
               ["o", C * C, true], ["o", C, false],
               ["norm2", C, false], ["norm2", C, false],
               ["mlp_in", C * F, true], ["mlp_in", F, false],
               ["down", F * C, true], ["down", C, false]];
      head = [C, C];
    } else { // RMSNorm weights, no biases, SwiGLU
      embed = [V * C];
      block = [["norm1", C, false],
               ["qkv", C * C, true], ["qkv", C * kv, true], ["qkv", C * kv, true],
               ["o", C * C, true],
               ["norm2", C, false],
               ["mlp_in", C * F, true], ["mlp_in", C * F, true],
               ["down", F * C, true]];
      head = [C];
    }
    if (!cfg.tied) {
      head.push(V * C);
    }
    return { embed: embed, block: block, head: head };
  }

  function partElements(block, part, weightsOnly) {
    return sum(block.filter(function (t) {
      return (part === null || t[0] === part) && (!weightsOnly || t[2]);
    }).map(function (t) {
      return t[1];
    }));
  }

  function linearCount(block, part) {
    return block.filter(function (t) {
      return t[0] === part && t[2];
    }).length;
  }

  /* [elements, how many such tensors] for every parameter tensor, tied ones once. */
  function paramTensors(cfg) {
    var g = paramGroups(cfg);
    var out = [];
    g.embed.forEach(function (t) { out.push([t, 1]); });
    g.block.forEach(function (t) { out.push([t[1], cfg.n_layer]); });
    g.head.forEach(function (t) { out.push([t, 1]); });
    return out;
  }

  function numParameters(cfg) {
    return sum(paramTensors(cfg).map(function (tk) { return tk[0] * tk[1]; }));
  }

  function isAdam(optimizer) {
    return optimizer === "adamw" || optimizer === "adam";
  }

  function optimizerStateBytes(cfg, K, precision, optimizer, impl, device) {
    var pb = K.param_bytes[precision];
    var fp32 = K.bytes.fp32;
    var tensors = paramTensors(cfg);
    var n = sum(tensors.map(function (tk) { return tk[0] * tk[1]; }));
    if (isAdam(optimizer)) {
      // Two moments in the parameters' dtype, and one fp32 step counter per tensor, which
      // lives on the host on CUDA unless the fused kernel is used.
      var nTensors = sum(tensors.map(function (tk) { return tk[1]; }));
      var counters = device === "cpu" || impl === "fused" ? fp32 * nTensors : 0;
      return 2 * pb * n + counters;
    }
    if (optimizer === "sgd-momentum") {
      return pb * n;
    }
    if (optimizer === "sgd") {
      return 0;
    }
    // adamw-8bit: two uint8 states and one fp32 absmax per block for each large tensor; a
    // small tensor keeps two fp32 states; two fp32 quantization maps shared by all.
    var total = 0;
    var anyLarge = false;
    tensors.forEach(function (tk) {
      var t = tk[0];
      if (t < K.bnb.min_numel) {
        total += tk[1] * 2 * fp32 * t;
      } else {
        anyLarge = true;
        total += tk[1] * (2 * K.bytes.uint8 * t + 2 * fp32 * Math.ceil(t / K.bnb.block));
      }
    });
    if (anyLarge) {
      total += 2 * K.bnb.map_entries * fp32;
    }
    return total;
  }

  /* foreach Adam(W) holds one parameter-sized scratch list while it steps; the for-loop
     version two of the largest tensor; fused kernels and SGD update in place. */
  function optimizerStepScratchBytes(cfg, K, precision, optimizer, impl) {
    if (!isAdam(optimizer) || impl === "fused") {
      return 0;
    }
    var pb = K.param_bytes[precision];
    var tensors = paramTensors(cfg);
    if (impl === "foreach") {
      return pb * sum(tensors.map(function (tk) { return tk[0] * tk[1]; }));
    }
    return 2 * pb * Math.max.apply(null, tensors.map(function (tk) { return tk[0]; }));
  }

  /* ---- saved tensors (memlab.memory.training.saved_tensors) ------------------------- */

  /* One saved tensor: scope 'layer' (per block), 'model' (once) or 'head'; stage: casts,
     attention norm, attention, MLP norm, MLP; flags for the backward walk. */
  function saved(scope, stage, bytes, flags) {
    return { scope: scope, stage: stage, bytes: bytes, linearInput: !!(flags && flags.linearInput),
             softmax: !!(flags && flags.softmax), flashLse: !!(flags && flags.flashLse),
             productFactor: !!(flags && flags.productFactor) };
  }

  function isMixed(precision) {
    return /-mixed$/.test(precision);
  }

  /* RMSNorm, computed in fp32: input (fp32), 1/rms, normalized x, output (or its 16-bit
     copies, one per Linear that reads it, under autocast). */
  function rmsnorm(stage, scope, BT, C, precision, consumers, K) {
    var fp32 = K.bytes.fp32;
    var half = K.bytes.half;
    var out = [saved(scope, stage, BT * C * fp32), saved(scope, stage, BT * fp32)];
    if (precision === "bf16") {
      out.push(saved(scope, stage, BT * C * half), saved(scope, stage, BT * C * half));
    } else if (precision === "fp32") {
      out.push(saved(scope, stage, BT * C * fp32), saved(scope, stage, BT * C * fp32));
    } else {
      out.push(saved(scope, stage, BT * C * fp32), saved(scope, stage, consumers * BT * C * half));
    }
    return out;
  }

  /* nn.LayerNorm: input, mean and 1/std, output (or its 16-bit copies under autocast). */
  function layernorm(stage, scope, BT, C, precision, consumers, device, K) {
    var sb = K.param_bytes[precision];
    var fp32 = K.bytes.fp32;
    var stat = sb === fp32 || device === "cuda" ? fp32 : K.bytes.half; // CPU: bf16 statistics
    var out = [saved(scope, stage, BT * C * sb), saved(scope, stage, 2 * BT * stat)];
    if (isMixed(precision)) {
      out.push(saved(scope, stage, consumers * BT * C * K.bytes.half));
    } else {
      out.push(saved(scope, stage, BT * C * sb));
    }
    return out;
  }

  /* q, k, v after RoPE and GQA repetition, and what the attention kernel keeps. */
  function attentionCore(cfg, B, T, precision, device, K) {
    var nh = cfg.n_head;
    var hs = cfg.head_dim;
    var C = cfg.d_model;
    var BT = B * T;
    var cb = K.compute_bytes[precision];
    var fp32 = K.bytes.fp32;
    var stage = "attention";
    var out = [];
    if (cfg.style === "llama" && cb !== fp32) { // cos and sin cast to 16 bits, for q and for k
      out.push(saved("layer", stage, 2 * 2 * T * Math.floor(hs / 2) * K.bytes.half));
    }
    if (cfg.attention === "flash") { // the book's FlashAttention: k and v per KV head, not repeated
      var kvBytes = B * cfg.kv_heads * T * hs * cb;
      out.push(saved("layer", stage, BT * C * cb), saved("layer", stage, kvBytes),
               saved("layer", stage, kvBytes), saved("layer", stage, BT * C * cb),
               saved("layer", stage, B * nh * T * fp32, { flashLse: true }),
               saved("layer", stage, BT * C * cb, { linearInput: true }));
      return out;
    }
    out.push(saved("layer", stage, BT * C * cb), saved("layer", stage, BT * C * cb),
             saved("layer", stage, BT * C * cb));
    if (cfg.attention === "sdpa") { // output and logsumexp
      out.push(saved("layer", stage, BT * C * cb), saved("layer", stage, B * nh * T * fp32));
    } else { // softmax probabilities (fp32 under CUDA autocast, and P @ V's 16-bit copy)
      var pb = isMixed(precision) && device === "cuda" ? fp32 : cb;
      out.push(saved("layer", stage, B * nh * T * T * pb, { softmax: true }));
      if (pb !== cb) { out.push(saved("layer", stage, B * nh * T * T * cb)); }
      out.push(saved("layer", stage, T * T * K.bytes.bool));  // the causal mask
    }
    // Merging the heads copies unless the kernel wrote (B, T, nh, hs) already.
    if (cfg.attention === "eager" || (device === "cpu" && cfg.style === "llama")) {
      out.push(saved("layer", stage, BT * C * cb, { linearInput: true }));
    }
    return out;
  }

  /* Bytes the book's FlashAttention backward allocates beyond what it saved, one layer
     (memlab.memory.training.flash_backward_workspace). */
  function flashBackwardWorkspace(cfg, B, T, precision, K) {
    var nh = cfg.n_head;
    var hs = cfg.head_dim;
    var fp32 = K.bytes.fp32;
    var cb = K.compute_bytes[precision];
    var qEl = B * nh * T * hs;
    var kvEl = B * cfg.kv_heads * T * hs;
    var b = Math.min(K.flash_block, T);
    var tile = fp32 * B * nh * b * b;
    var base = fp32 * (qEl + 2 * kvEl) + fp32 * B * nh * T; // dQ, dK, dV and the row sums D
    if (cb === fp32) {
      return base + K.flash_tiles.loop * tile;
    }
    var blocks = fp32 * (B * nh * b * hs + 2 * B * cfg.kv_heads * b * hs); // Q_i, K_j, V_j
    var dO = fp32 * qEl;
    var loop = base + dO + blocks + K.flash_tiles.loop * tile;
    var end = base + dO + blocks + K.flash_tiles.end * tile + cb * (qEl + 2 * kvEl);
    return Math.max(loop, end);
  }

  function linearWeightElements(cfg) {
    return partElements(paramGroups(cfg).block, null, true);
  }

  /* Under autocast every Linear weight of the block is cached in 16 bits. */
  function weightCasts(cfg, precision, K) {
    if (!isMixed(precision)) {
      return [];
    }
    return [saved("layer", "casts", K.bytes.half * linearWeightElements(cfg))];
  }

  /* What one block saves, in forward order (memlab.model.transformer.Block). */
  function blockTensors(cfg, B, T, precision, device, K) {
    var C = cfg.d_model;
    var F = cfg.ffn_dim;
    var BT = B * T;
    var cb = K.compute_bytes[precision];
    var block = paramGroups(cfg).block;
    var out = weightCasts(cfg, precision, K);
    if (cfg.style === "llama") {
      out = out.concat(rmsnorm("attention norm", "layer", BT, C, precision, linearCount(block, "qkv"), K));
      out = out.concat(attentionCore(cfg, B, T, precision, device, K));
      out = out.concat(rmsnorm("MLP norm", "layer", BT, C, precision, linearCount(block, "mlp_in"), K));
      // gate, silu(gate), up (a factor of the product: its backward returns both gradients), silu(gate) * up
      out.push(saved("layer", "MLP", BT * F * cb), saved("layer", "MLP", BT * F * cb),
               saved("layer", "MLP", BT * F * cb, { productFactor: true }),
               saved("layer", "MLP", BT * F * cb, { linearInput: true }));
    } else {
      out = out.concat(layernorm("attention norm", "layer", BT, C, precision,
                                 linearCount(block, "qkv"), device, K));
      out = out.concat(attentionCore(cfg, B, T, precision, device, K));
      out = out.concat(layernorm("MLP norm", "layer", BT, C, precision,
                                 linearCount(block, "mlp_in"), device, K));
      // up projection (GELU input), GELU output
      out.push(saved("layer", "MLP", BT * F * cb),
               saved("layer", "MLP", BT * F * cb, { linearInput: true }));
    }
    return out;
  }

  function savedTensors(cfg, B, T, precision, checkpointing, device, K) {
    var C = cfg.d_model;
    var V = cfg.vocab_size;
    var BT = B * T;
    var cb = K.compute_bytes[precision];
    var sb = K.param_bytes[precision];
    var fp32 = K.bytes.fp32;
    var out = [];
    // RoPE tables, fp32, once per forward: saved once in fp32 attention or with checkpointing.
    if (cfg.style === "llama" && (checkpointing || cb === fp32)) {
      out.push(saved("model", null, 2 * T * Math.floor(cfg.head_dim / 2) * fp32));
    }
    if (cfg.style === "gpt2") { // positions 0..T-1
      out.push(saved("model", null, T * K.bytes.int64));
    }
    if (checkpointing) { // each block's input
      out.push(saved("layer", "block input", BT * C * sb));
    } else {
      out = out.concat(blockTensors(cfg, B, T, precision, device, K));
    }
    // The final norm (read by lm_head alone), the head, the loss.
    if (cfg.style === "llama") {
      out = out.concat(rmsnorm("final norm", "head", BT, C, precision, 1, K));
    } else {
      out = out.concat(layernorm("final norm", "head", BT, C, precision, 1, device, K));
    }
    if (isMixed(precision)) { // lm_head weight cast to 16 bits
      out.push(saved("head", null, V * C * K.bytes.half));
    }
    out.push(saved("head", null, BT * V * fp32), saved("head", null, fp32)); // log-softmax, loss
    return out;
  }

  function activationBytes(tensors, nLayer) {
    return sum(tensors.map(function (t) { return t.bytes * (t.scope === "layer" ? nLayer : 1); }));
  }

  /* At each stage of a block's backward: gradient bytes already computed in the block, and
     bytes of the 16-bit weight casts still alive under autocast. */
  function gradsDoneInBlock(cfg, precision, K) {
    var block = paramGroups(cfg).block;
    var pb = K.param_bytes[precision];
    var cast = isMixed(precision) ? K.bytes.half : 0;
    var total = partElements(block, null, false);
    var norm1 = partElements(block, "norm1", false);
    var o = partElements(block, "o", false);
    var norm2 = partElements(block, "norm2", false);
    var down = partElements(block, "down", false);
    var mlp = partElements(block, "mlp_in", false) + down;
    var qkvW = partElements(block, "qkv", true);
    var oW = partElements(block, "o", true);
    var mlpInW = partElements(block, "mlp_in", true);
    return {
      "attention norm": [pb * (total - norm1), cast * qkvW],
      "attention": [pb * (o + norm2 + mlp), cast * qkvW],
      "MLP norm": [pb * mlp, cast * (qkvW + oW)],
      "MLP": [pb * down, cast * (qkvW + oW + mlpInW)],
    };
  }

  /* Activation-side bytes at the forward and the backward pass's highest points. */
  function activationPeaks(cfg, tensors, B, T, precision, checkpointing, device, accumulating, K) {
    var V = cfg.vocab_size;
    var C = cfg.d_model;
    var BT = B * T;
    var L = cfg.n_layer;
    var cb = K.compute_bytes[precision];
    var sb = K.param_bytes[precision];
    var pb = K.param_bytes[precision];
    var fp32 = K.bytes.fp32;
    var modelLevel = sum(tensors.filter(function (t) { return t.scope === "model"; })
                         .map(function (t) { return t.bytes; }));
    var stored = sum(tensors.filter(function (t) { return t.scope === "layer"; })
                     .map(function (t) { return t.bytes; }));
    var A = activationBytes(tensors, L);
    var block = blockTensors(cfg, B, T, precision, device, K); // the full, recomputed block
    var blockBytes = sum(block.map(function (t) { return t.bytes; }));

    // Forward: everything saved, plus the logits (and their fp32 copy) during the loss.
    var fwd = A + BT * V * cb + (cb !== fp32 ? BT * V * fp32 : 0);
    if (checkpointing && isMixed(precision)) { // every block's weight casts, until autocast exits
      fwd += L * K.bytes.half * linearWeightElements(cfg);
    }
    var softmaxAt = null; // [bytes saved in the block up to its softmax, bytes of the scores]
    if (cfg.attention === "eager") {
      var before = 0;
      for (var i = 0; i < block.length; i++) {
        before += block[i].bytes;
        if (block[i].softmax) { // CUDA autocast: the softmax reads an fp32 copy of the scores
          var scores = B * cfg.n_head * T * T * cb;
          softmaxAt = [before, block[i].bytes !== scores ? scores + B * cfg.n_head * T * T * fp32
                                                         : scores];
          break;
        }
      }
    }
    if (softmaxAt !== null) { // the last block's softmax, its masked scores alive beside it
      var belowF = checkpointing ? L * stored : (L - 1) * blockBytes;
      fwd = Math.max(fwd, modelLevel + belowF + softmaxAt[0] + softmaxAt[1]);
    }

    // Backward: at its start the fp32 gradients of log-softmax's output and input; then each
    // saved tensor's backward, walked through the last and the first block.
    var bwd = A + 2 * BT * V * fp32;
    var g = paramGroups(cfg);
    var gBlock = pb * partElements(g.block, null, false);
    var gHead = pb * sum(g.head);
    var inBlock = gradsDoneInBlock(cfg, precision, K);
    var freshGrad = pb * Math.max.apply(null, g.block.map(function (t) { return t[1]; }));
    var dx = BT * C * sb; // gradient of the residual stream
    [L - 1, 0].forEach(function (layer) {
      var done = accumulating ? freshGrad : gHead + (L - 1 - layer) * gBlock;
      var below = checkpointing ? (layer + 1) * stored : layer * blockBytes;
      if (checkpointing && softmaxAt !== null) { // the recomputed forward's softmax
        bwd = Math.max(bwd, modelLevel + below + softmaxAt[0] + softmaxAt[1] + done + dx);
      }
      var prefix = 0;
      block.forEach(function (t) {
        if (t.stage === "casts") { // freed one Linear at a time: counted per stage
          return;
        }
        prefix += t.bytes;
        var gradsDone = accumulating ? 0 : inBlock[t.stage][0];
        var castsAlive = inBlock[t.stage][1];
        var dOut = t.stage === "attention" ? BT * C * cb : 0;
        var consumerGrad = t.linearInput ? BT * C * cb : t.bytes;
        if (t.productFactor) { // the product's backward returns both factors' gradients at once
          consumerGrad = 2 * t.bytes;
        }
        if (t.flashLse) { // FlashAttention's backward: its fp32 accumulators and tiles
          consumerGrad = flashBackwardWorkspace(cfg, B, T, precision, K) - t.bytes;
        }
        var alive = modelLevel + below + prefix + castsAlive + done + gradsDone + dx + dOut +
          t.bytes + consumerGrad;
        bwd = Math.max(bwd, alive);
      });
    });
    return [fwd, bwd, A];
  }

  /* ---- the estimate (memlab.memory.training.estimate, mode 'train') ----------------- */

  function positiveInt(what, value) {
    if (typeof value !== "number" || !Number.isInteger(value) || value <= 0) {
      fail(what + " must be a positive integer, got " + pyRepr(value));
    }
    return value;
  }

  function choice(what, value, accepted) {
    if (accepted.indexOf(value) < 0) {
      fail("unknown " + what + " " + pyRepr(value) + "; accepted: " + accepted.join(", "));
    }
    return value;
  }

  /* The switches checked as memlab.measure.step.StepSpec checks them. */
  function checkSetting(cfg, s, K) {
    choice("device", s.device, K.devices);
    choice("attention", s.attention, K.attentions);
    positiveInt("batch_size", s.batch_size);
    positiveInt("seq_len", s.seq_len);
    if (s.seq_len > cfg.max_seq_len) {
      fail("seq_len " + s.seq_len + " exceeds max_seq_len " + cfg.max_seq_len + " of model " +
           pyRepr(cfg.name));
    }
    choice("precision", s.precision, K.precisions);
    choice("optimizer", s.optimizer, K.optimizers);
    choice("optimizer_impl", s.optimizer_impl, K.optimizer_impls);
    if (s.optimizer === "adamw-8bit" && s.optimizer_impl === "fused") {
      fail("optimizer 'adamw-8bit' has its own kernels; accepted optimizer_impl for it: " +
           K.optimizer_impls.filter(function (i) { return i !== "fused"; }).join(", "));
    }
    positiveInt("grad_accum_steps", s.grad_accum_steps);
  }

  function estimate(cfg0, s, K) {
    checkSetting(cfg0, s, K);
    var cfg = Object.assign({}, cfg0, { attention: s.attention });
    var B = s.batch_size;
    var T = s.seq_len;
    var BT = B * T;
    var precision = s.precision;
    var pb = K.param_bytes[precision];
    var accumulating = s.grad_accum_steps > 1;
    var n = numParameters(cfg);
    var P = pb * n;
    var G = P;
    var S = optimizerStateBytes(cfg, K, precision, s.optimizer, s.optimizer_impl, s.device);
    var tensors = savedTensors(cfg, B, T, precision, s.checkpointing, s.device, K);
    var peaks = activationPeaks(cfg, tensors, B, T, precision, s.checkpointing, s.device,
                                accumulating, K);
    var fwd = peaks[0];
    var bwd = peaks[1];
    var A = peaks[2];
    var tokens = 2 * BT * K.bytes.int64; // input ids and targets
    // With accumulation, earlier micro-batches' gradients stay alive through the next passes.
    var gLive = accumulating ? G : 0;
    var base = P + S + gLive + tokens;
    // A tied embedding gets two gradients, summed at the very end of the backward pass; with
    // accumulation the new embedding gradient is a temporary added into .grad.
    var VC = cfg.vocab_size * cfg.d_model * pb;
    var end = accumulating ? P + S + G + (cfg.tied ? 3 * VC : VC) + tokens
      : P + S + G + (cfg.tied ? 2 * VC : 0) + tokens;
    var step = s.optimizer === "adamw-8bit" ? 0
      : optimizerStepScratchBytes(cfg, K, precision, s.optimizer, s.optimizer_impl);
    var phases = {
      forward: base + fwd,
      backward: Math.max(base + bwd, end),
      optimizer: P + S + G + step + tokens,
    };
    var peakPhase = K.phases[0];
    K.phases.forEach(function (p) {
      if (phases[p] > phases[peakPhase]) {
        peakPhase = p;
      }
    });
    function cats(grads, acts, total) {
      var d = { parameters: P, gradients: grads, optimizer_states: S, activations: acts, other: tokens };
      d.temporaries = total - (P + grads + S + acts + tokens);
      return d;
    }
    var startWins = base + bwd >= end; // the backward's high point is before the gradients grow
    return {
      parameters: n,
      weights_bytes: P,
      gradients_bytes: G,
      optimizer_bytes: S,
      activations_bytes: A,
      other_bytes: tokens,
      peak_bytes: phases[peakPhase],
      peak_phase: peakPhase,
      phase_peak_bytes: phases,
      breakdown: {
        forward: cats(gLive, A, phases.forward),
        backward: startWins ? cats(gLive, A, phases.backward) : cats(G, 0, phases.backward),
        optimizer: cats(G, 0, phases.optimizer),
      },
    };
  }

  /* ---- a Hugging Face config.json (memlab.model.transformer.config_from_hf_dict) ---- */

  function hfValue(source, key, value, kind, K) {
    var ok;
    if (kind === "count" || kind === "count-or-null") {
      if (value === null && kind === "count-or-null") {
        return null;
      }
      ok = typeof value === "number" && Number.isInteger(value) && value > 0;
    } else if (kind === "number") {
      ok = typeof value === "number";
    } else { // flag-or-null
      ok = value === null || value === true || value === false;
    }
    if (!ok) {
      fail(source + ": " + key + " must be " + K.hf.kinds[kind] + ", got " + pyRepr(value));
    }
    return value;
  }

  function has(raw, key) {
    return Object.prototype.hasOwnProperty.call(raw, key);
  }

  function configFromHF(raw, K, source) {
    if (raw === null || typeof raw !== "object" || Array.isArray(raw)) {
      fail(source + " must hold a JSON object");
    }
    var mtype = has(raw, "model_type") ? raw.model_type : null;
    var styles = Object.keys(K.hf.styles);
    if (typeof mtype !== "string" || !has(K.hf.styles, mtype)) {
      fail(source + " has model_type " + pyRepr(mtype) + "; accepted: " + styles.join(", "));
    }
    var style = K.hf.styles[mtype];
    if (style === "llama") {
      K.hf.bias_flags.forEach(function (flag) {
        var v = has(raw, flag) ? raw[flag] : null;
        var truthy = v !== null && v !== false && v !== 0 && v !== "" &&
          !(Array.isArray(v) && v.length === 0) &&
          !(typeof v === "object" && !Array.isArray(v) && Object.keys(v).length === 0);
        if (truthy) {
          fail(source + " sets " + flag + " to " + pyRepr(v) + ": biases in attention or MLP, " +
               "which the book's Llama-style model does not have; accepted: false or absent");
        }
      });
    }
    var values = {};
    var used = {};
    K.hf.fields[style].forEach(function (f) {
      var key = null;
      for (var i = 0; i < f.keys.length; i++) {
        if (has(raw, f.keys[i])) {
          key = f.keys[i];
          break;
        }
      }
      if (key === null) {
        if (f.required) {
          fail(source + " lacks the key " + pyRepr(f.keys[0]) + "; accepted keys: " +
               f.keys.join(", "));
        }
        values[f.field] = f.default;
      } else {
        values[f.field] = hfValue(source, key, raw[key], f.kind, K);
      }
      used[f.field] = key || f.keys[0];
    });
    var C = values.d_model;
    var nh = values.n_head;
    var nkv = has(values, "n_kv_head") ? values.n_kv_head : null;
    if (C % nh) {
      fail(source + ": " + used.d_model + " (" + C + ") must be divisible by " + used.n_head +
           " (" + nh + ")");
    }
    if (nkv !== null && nh % nkv) {
      fail(source + ": " + used.n_kv_head + " (" + nkv + ") must divide " + used.n_head + " (" +
           nh + ")");
    }
    var hs = Math.floor(C / nh);
    if (style === "llama" && has(raw, "head_dim") && raw.head_dim !== null && raw.head_dim !== hs) {
      fail(source + " sets head_dim " + pyRepr(raw.head_dim) + ", not " + used.d_model + " / " +
           used.n_head + " = " + hs + ", which the book's model needs; accepted: " + hs +
           " or absent");
    }
    var name = typeof raw._name_or_path === "string" && raw._name_or_path ? raw._name_or_path
      : mtype + " (" + values.n_layer + " layers, width " + C + ")";
    var tied = values.tie_embeddings === null ? K.hf.tied_by_default[style] : values.tie_embeddings;
    // A GPT-2 config may leave n_inner null: the MLP is then a fixed multiple of the width.
    var ffn = values.d_ff === null || values.d_ff === undefined ? K.hf.gpt2_ffn_per_width * C
      : values.d_ff;
    return {
      name: name, style: style, vocab_size: values.vocab_size, n_layer: values.n_layer,
      n_head: nh, kv_heads: nkv === null ? nh : nkv, d_model: C, head_dim: hs, ffn_dim: ffn,
      max_seq_len: values.max_seq_len, tied: tied, attention: K.hf.attention,
    };
  }

  /* ---- what the page shows ------------------------------------------------------------ */

  function amount(bytes, unit, K) {
    return pyFixed(bytes / K.units[unit], K.decimals) + " " + unit;
  }

  function modelLabel(cfg, K) {
    return cfg.name + " (" + pyFixed(numParameters(cfg) / K.billion, K.decimals) + "B)";
  }

  /* The page's texts and bytes for one setting: the same dict as
     memlab.interactive.estimator.estimate_readout. */
  function readout(cfg, setting, K) {
    try {
      var s = Object.assign({}, setting);
      var note = "";
      positiveInt("seq_len", s.seq_len);
      if (s.seq_len > cfg.max_seq_len) {
        note = "note: " + cfg.name + " takes at most " + intText(cfg.max_seq_len) +
          " tokens; sequence length " + intText(s.seq_len) + " capped at " +
          intText(cfg.max_seq_len);
        s.seq_len = cfg.max_seq_len;
      }
      var est = estimate(cfg, s, K);
      if (!(est.peak_bytes <= Number.MAX_SAFE_INTEGER)) {
        fail("the estimated peak is beyond " + intText(Number.MAX_SAFE_INTEGER) +
             " bytes, more than this page computes exactly");
      }
      var unit = est.peak_bytes >= K.units[K.big_unit] ? K.big_unit : K.small_unit;
      var setup = cfg.name + ": " + intText(est.parameters) + " parameters; batch " +
        s.batch_size + " \u00d7 " + intText(s.seq_len) + " tokens, " + s.precision + ", " +
        s.optimizer + " (" + s.optimizer_impl + "), " + s.attention + " attention" +
        (s.checkpointing ? ", checkpointing" : "") +
        (s.grad_accum_steps > 1 ? ", " + s.grad_accum_steps + " accumulation steps" : "") +
        ", " + s.device + " conventions";
      var phases = {};
      K.phases.forEach(function (p) {
        var cats = {};
        K.categories.forEach(function (c) {
          cats[c.key] = est.breakdown[p][c.key];
        });
        phases[p] = { total: amount(est.phase_peak_bytes[p], unit, K),
                      bytes: est.phase_peak_bytes[p], categories: cats };
      });
      var atPeak = {};
      K.categories.forEach(function (c) {
        atPeak[c.key] = amount(est.breakdown[est.peak_phase][c.key], unit, K);
      });
      var gpus = {};
      var fitting = [];
      K.gpus.forEach(function (g) {
        gpus[g.name] = est.peak_bytes <= g.usable_bytes;
        if (gpus[g.name]) {
          fitting.push(g.name);
        }
      });
      return {
        error: null,
        model: cfg.name,
        parameters: est.parameters,
        note: note,
        setup: setup,
        peak: "estimated peak " + amount(est.peak_bytes, unit, K) + ", in the " + est.peak_phase +
          " phase",
        peak_bytes: est.peak_bytes,
        peak_phase: est.peak_phase,
        unit: unit,
        phases: phases,
        at_peak: atPeak,
        gpus: gpus,
        fits: fitting.length ? "fits on: " + fitting.join(", ") : "fits on none of these GPUs",
      };
    } catch (err) {
      if (err && err.memlab) {
        return { error: "memlab: error: " + err.message };
      }
      throw err;
    }
  }

  /* ---- the page ------------------------------------------------------------------------ */

  function q(el, role) {
    return el.querySelector('[data-role="' + role + '"]');
  }

  /* An integer typed in a box: the number, or the text itself when it is not one. */
  function typedInt(text) {
    var t = String(text).trim();
    return /^-?\d+$/.test(t) ? parseInt(t, 10) : t;
  }

  function mount(rootEl, K) {
    if (!rootEl || rootEl.getAttribute("data-mounted") === "1") {
      return null;
    }
    rootEl.setAttribute("data-mounted", "1");
    var models = {};
    K.models.forEach(function (m) {
      models[m.key] = m.config;
    });
    var controls = {};
    ["model", "batch_size", "seq_len", "precision", "optimizer", "optimizer_impl", "attention",
     "checkpointing", "grad_accum_steps", "device"].forEach(function (k) {
      controls[k] = q(rootEl, k);
    });
    var pasteText = q(rootEl, "config-text");
    var pasteButton = q(rootEl, "config-apply");
    var pasteStatus = q(rootEl, "config-status");
    var pastedOption = rootEl.querySelector('option[value="' + K.pasted_key + '"]');
    var results = q(rootEl, "results");
    var errorEl = q(rootEl, "error");

    function setting() {
      return {
        batch_size: typedInt(controls.batch_size.value),
        seq_len: typedInt(controls.seq_len.value),
        precision: controls.precision.value,
        optimizer: controls.optimizer.value,
        optimizer_impl: controls.optimizer_impl.value,
        attention: controls.attention.value,
        checkpointing: controls.checkpointing.checked,
        grad_accum_steps: typedInt(controls.grad_accum_steps.value),
        device: controls.device.value,
      };
    }

    function show(r) {
      if (r.error) {
        errorEl.textContent = r.error;
        errorEl.hidden = false;
        results.hidden = true;
        rootEl.setAttribute("data-state", "error");
        return;
      }
      errorEl.textContent = "";
      errorEl.hidden = true;
      results.hidden = false;
      rootEl.setAttribute("data-state", "ok");
      q(results, "note").textContent = r.note;
      q(results, "note").hidden = !r.note;
      q(results, "setup").textContent = r.setup;
      var peak = q(results, "peak");
      peak.textContent = r.peak;
      peak.setAttribute("data-bytes", String(r.peak_bytes));
      peak.setAttribute("data-phase", r.peak_phase);
      K.phases.forEach(function (p) {
        var row = results.querySelector('[data-role="phase"][data-phase="' + p + '"]');
        var ph = r.phases[p];
        row.setAttribute("data-bytes", String(ph.bytes));
        row.setAttribute("data-peak", p === r.peak_phase ? "true" : "false");
        q(row, "phase-total").textContent = ph.total;
        K.categories.forEach(function (c) {
          var seg = row.querySelector('[data-category="' + c.key + '"]');
          var b = ph.categories[c.key];
          seg.setAttribute("data-bytes", String(b));
          seg.style.width = (r.peak_bytes > 0 ? b / r.peak_bytes * 100 : 0) + "%";
          seg.title = c.label + ": " + amount(b, r.unit, K);
        });
      });
      K.categories.forEach(function (c) {
        var el = results.querySelector('[data-role="at-peak"][data-category="' + c.key + '"]');
        el.textContent = r.at_peak[c.key];
        el.setAttribute("data-bytes", String(r.phases[r.peak_phase].categories[c.key]));
      });
      q(results, "at-peak-phase").textContent = r.peak_phase;
      K.gpus.forEach(function (g) {
        var el = results.querySelector('[data-role="gpu"][data-gpu="' + g.name + '"]');
        el.setAttribute("data-fits", r.gpus[g.name] ? "true" : "false");
        q(el, "gpu-mark").textContent = r.gpus[g.name] ? "\u2713" : "\u2717";
      });
      q(results, "fits").textContent = r.fits;
    }

    var pasted = null;

    function recompute() {
      var cfg = controls.model.value === K.pasted_key ? pasted : models[controls.model.value];
      var r = readout(cfg, setting(), K);
      show(r);
      return r;
    }

    function applyPasted() {
      var raw;
      try {
        raw = JSON.parse(pasteText.value);
      } catch (err) {
        pasteStatus.textContent = "memlab: error: " + K.pasted_source + " is not valid JSON (" +
          err.message + ")";
        pasteStatus.setAttribute("data-state", "error");
        return;
      }
      try {
        pasted = configFromHF(raw, K, K.pasted_source);
      } catch (err) {
        if (!(err && err.memlab)) {
          throw err;
        }
        pasteStatus.textContent = "memlab: error: " + err.message;
        pasteStatus.setAttribute("data-state", "error");
        return;
      }
      pastedOption.disabled = false;
      pastedOption.textContent = "pasted: " + modelLabel(pasted, K);
      controls.model.value = K.pasted_key;
      pasteStatus.textContent = "using " + pasted.name + ": " + intText(numParameters(pasted)) +
        " parameters";
      pasteStatus.setAttribute("data-state", "ok");
      recompute();
    }

    Object.keys(controls).forEach(function (k) {
      controls[k].addEventListener("change", recompute);
      controls[k].addEventListener("input", recompute);
    });
    pasteButton.addEventListener("click", applyPasted);
    recompute();
    rootEl.setAttribute("data-ready", "1");
    return { recompute: recompute, applyPasted: applyPasted };
  }

  /* Mount the estimator whose root has this id, from the JSON in its script element; waits
     (briefly) for an output that is attached to the page after its script ran. */
  function mountById(id, tries) {
    var el = typeof document !== "undefined" ? document.getElementById(id) : null;
    if (!el) {
      if ((tries || 0) < 100 && typeof setTimeout === "function") {
        setTimeout(function () {
          mountById(id, (tries || 0) + 1);
        }, 50);
      }
      return;
    }
    var dataEl = el.querySelector('script[data-role="data"]');
    mount(el, JSON.parse(dataEl.textContent));
  }

  return {
    version: VERSION,
    pyFixed: pyFixed,
    pyRepr: pyRepr,
    numParameters: numParameters,
    savedTensors: savedTensors,
    estimate: estimate,
    configFromHF: configFromHF,
    readout: readout,
    modelLabel: modelLabel,
    mount: mount,
    mountById: mountById,
  };
});
