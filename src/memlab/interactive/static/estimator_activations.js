/* memlab memory estimator, its activation side (chapters 1 and 8).
 *
 * The walk's tables (memlab.interactive.walk, committed as static/estimator_walk.json) read at
 * a setting's sizes, and the activation side of the peak (memlab.memory.activations): the saved
 * tensors, the head and the loss (whole or chunked), checkpointing, activation offloading and
 * the ring of context parallelism (memlab.memory.context), and a mixture of experts' block
 * (the walk's moe tables, memlab.moe.saved; its parameters, rows and gradients, memlab.moe). Each
 * function names the Python
 * function it mirrors; every number it multiplies by comes from Python as JSON. estimator.js
 * builds the estimate and the page on it.
 *
 * Exposed as globalThis.memlabEstimatorActivations (and module.exports under Node).
 */
(function (root, factory) {
  "use strict";
  var node = typeof module === "object" && module && module.exports && typeof require === "function";
  var api = factory(node ? require("./format.js") : root.memlabFormat);
  if (node) {
    module.exports = api;
  }
  if (root) {
    root.memlabEstimatorActivations = api;
  }
})(typeof globalThis !== "undefined" ? globalThis : typeof window !== "undefined" ? window : this,
   function (format) {
  "use strict";

  var pyRepr = format.pyRepr;

  function MemlabError(message) {
    this.memlab = true;
    this.message = message;
  }

  function fail(message) {
    throw new MemlabError(message);
  }

  function product(xs) { return xs.reduce(function (acc, x) { return acc * x; }, 1); }

  function sum(xs) {
    var s = 0;
    for (var i = 0; i < xs.length; i++) {
      s += xs[i];
    }
    return s;
  }

  /* ---- the tables (memlab.interactive.walk.walk_tables) ----------------------------- */

  /* moe_rows under balanced routing: the rows the experts keep of N tokens' N*k, each expert
     at most ceil(c*N*k/E) with a capacity factor c (MoEConfig.capacity, Routing.counts). */
  function moeRows(m, N) {
    var rows = N * m.top_k, E = m.experts, q = Math.floor(rows / E), r = rows - q * E;
    var cap = m.capacity_factor === null || m.capacity_factor === undefined ? null
      : Math.ceil(m.capacity_factor * N * m.top_k / E);
    var keep = function (c) { return cap === null ? c : Math.min(c, cap); };
    return r * keep(q + 1) + (E - r) * keep(q);
  }

  /* A setting with a mixture of experts' sizes and switches (the walk's E, k, Fe, Fs, R and
     MOE_SWITCHES), or the setting itself for a dense model. */
  function withExperts(cfg, s) {
    var m = cfg.moe;
    if (!m || s.moe_rows !== undefined) {
      return s;
    }
    return Object.assign({}, s, {
      experts: m.experts, top_k: m.top_k, expert_ffn_dim: m.d_ff, shared_ffn_dim: m.shared_d_ff,
      moe_rows: s.batch_size === undefined ? 0 : moeRows(m, s.batch_size * s.seq_len),
      norm_topk_prob: m.norm_topk_prob,
      shared_expert: !m.shared_d_ff ? "none" : m.shared_gate ? "gated" : "ungated",
      aux_loss: !!m.aux_loss_coef,
    });
  }

  /* The value of each shape symbol: a setting's field (B, T) or the config's (C, F, ...). */
  function dims(cfg, s0, K) {
    var d = {}, s = withExperts(cfg, s0);
    Object.keys(K.walk.symbols).forEach(function (sym) {
      var field = K.walk.symbols[sym];
      d[sym] = Object.prototype.hasOwnProperty.call(s, field) ? s[field] : cfg[field];
    });
    return d;
  }

  /* A polynomial [[coefficient, [symbol, ...]], ...] at these sizes; 'x//k' is x // k. */
  function poly(p, d) {
    return sum(p.map(function (term) {
      return term[1].reduce(function (acc, sym) {
        var cut = sym.indexOf("//");
        return acc * (cut < 0 ? d[sym] : Math.floor(d[sym.slice(0, cut)] / Number(sym.slice(cut + 2))));
      }, term[0]);
    }));
  }

  /* A row's dtype under this setting ({by: switches, dtype: {values: dtype}}), or null when
     the setting saves no such tensor. */
  function rowDtype(row, s) {
    var key = row.by.map(function (sw) {
      return String(s[sw]);
    }).join("/");
    return Object.prototype.hasOwnProperty.call(row.dtype, key) ? row.dtype[key] : null;
  }

  /* The rows of a table this setting saves, with their bytes. */
  function rows(table, s, d, K) {
    var out = [];
    table.forEach(function (row) {
      var dtype = rowDtype(row, s);
      if (dtype !== null) {
        out.push({ name: row.name, scope: row.scope, stage: row.stage, role: row.role,
                   dtype: dtype, bytes: (K.walk.dtype_bytes[dtype] || 0) * poly(row.numel, d) });
      }
    });
    return out;
  }

  function styleTables(cfg, K) {
    return K.walk.styles[cfg.style];
  }

  /* The saved-tensor tables: the style's, or a mixture of experts' (moe_saved_tensors). */
  function savedTables(cfg, K) {
    return cfg.moe ? K.walk.moe : styleTables(cfg, K);
  }

  /* What one block saves, recomputed whole when checkpointed (_llama_block, _gpt2_block). */
  function blockTensors(cfg, s, d, K) {
    return rows(savedTables(cfg, K).block, withExperts(cfg, s), d, K);
  }

  /* Every saved tensor of a step (saved_tensors): the row 'block' stands for the block's list. */
  function savedTensors(cfg, s0, K) {
    var s = withExperts(cfg, s0);
    var d = dims(cfg, s, K);
    var out = [];
    rows(savedTables(cfg, K).saved, s, d, K).forEach(function (t) {
      out = out.concat(t.dtype === "block" ? blockTensors(cfg, s, d, K) : [t]);
    });
    return out;
  }

  /* A mixture of experts' block shapes (param_shape_groups with mlp_shapes): the dense block
     without its MLP, the router (E, C), each expert's SwiGLU, the shared expert and its gate. */
  function expertBlockShapes(cfg, K, d) {
    var m = cfg.moe, t = K.walk.moe;
    var at = function (shape) { return shape.map(function (p) { return poly(p, d); }); };
    var out = t.attention_shapes[cfg.qkv_bias ? "bias" : "plain"].map(at);
    out.push([m.experts, cfg.d_model]);
    var expert = t.expert_shapes.map(at);
    for (var e = 0; e < m.experts; e++) {
      out = out.concat(expert);
    }
    out = out.concat(m.shared_d_ff ? t.shared_shapes.map(at) : []);
    return m.shared_gate ? out.concat([[1, cfg.d_model]]) : out;
  }

  /* The parameter tensors' element counts (param_groups): embeddings, one block's, head's. */
  function paramGroups(cfg, K) {
    var g = styleTables(cfg, K).params[cfg.tied ? "tied" : "untied"];
    var d = dims(cfg, {}, K);
    var at = function (p) { return poly(p, d); };
    var block = cfg.moe ? expertBlockShapes(cfg, K, d).map(product) : g.block.map(at);
    return { embed: g.embed.map(at), block: block, head: g.head.map(at) };
  }

  /* One expert's parameters (MoEConfig: a block's less its active ones, per unchosen expert). */
  function expertParameters(cfg, K) {
    var d = dims(cfg, {}, K);
    return sum(K.walk.moe.expert_shapes.map(function (shape) {
      return product(shape.map(function (p) { return poly(p, d); }));
    }));
  }

  /* ModelConfig.active_parameters: all but the experts a token does not go to. */
  function activeParameters(cfg, K) {
    return numParameters(cfg, K) -
      cfg.n_layer * (cfg.moe.experts - cfg.moe.top_k) * expertParameters(cfg, K);
  }

  /* The gradients done and 16-bit weight casts alive at each stage of an MoE block's backward
     (memlab.moe.estimate._moe_grads); the down projections are one of the expert's Linears. */
  function expertGradsInBlock(cfg, precision, K) {
    var C = cfg.d_model, kv = cfg.kv_heads * cfg.head_dim, pb = K.param_bytes[precision];
    var block = paramGroups(cfg, K).block, total = sum(block);
    var qkvW = C * C + 2 * C * kv, mlp = total - 2 * C - qkvW - C * C;
    var third = K.walk.moe.swiglu_linears;
    var cast = /-mixed$/.test(precision) ? K.bytes.bf16 : 0;
    var weights = qkvW + C * C + sum(expertBlockShapes(cfg, K, dims(cfg, {}, K)).slice(
      K.walk.moe.attention_shapes[cfg.qkv_bias ? "bias" : "plain"].length).map(product));
    return { "attention norm": [pb * (total - C), cast * qkvW],
             attention: [pb * (C * C + C + mlp), cast * qkvW],
             "MLP norm": [pb * mlp, cast * (qkvW + C * C)],
             MLP: [Math.floor(pb * mlp / third), cast * (weights - Math.floor(mlp / third))] };
  }

  /* [elements, how many such tensors] for every parameter tensor (estimator._param_tensors). */
  function paramTensors(cfg, K) {
    var g = paramGroups(cfg, K);
    var once = function (t) { return [t, 1]; };
    return g.embed.map(once).concat(g.block.map(function (t) { return [t, cfg.n_layer]; }),
                                    g.head.map(once));
  }

  /* [[dims], how many] for every parameter tensor, in the model's order (param_shapes). */
  function paramShapes(cfg, K) {
    var g = styleTables(cfg, K).shapes[cfg.tied ? "tied" : "untied"], d = dims(cfg, {}, K);
    var at = function (k) {
      return function (t) { return [t.map(function (p) { return poly(p, d); }), k]; };
    };
    var block = cfg.moe ? expertBlockShapes(cfg, K, d).map(function (t) { return [t, cfg.n_layer]; })
      : g.block.map(at(cfg.n_layer));
    return g.embed.map(at(1)).concat(block, g.head.map(at(1)));
  }


  function numParameters(cfg, K) {
    return sum(paramTensors(cfg, K).map(function (tk) { return tk[0] * tk[1]; }));
  }
  /* ---- the activation side of the peak (memlab.memory.activations) ------------------ */

  /* flash_backward_workspace: dQ, dK, dV in fp32 beside the row sums D and a few tiles per
     query head; 16-bit inputs add dO and the blocks in fp32, and the gradients cast back. */
  function flashBackwardWorkspace(cfg, B, T, precision, K) {
    var nh = cfg.n_head;
    var hs = cfg.head_dim;
    var fp32 = K.bytes.fp32;
    var cb = K.compute_bytes[precision];
    var qEl = B * nh * T * hs;
    var kvEl = B * cfg.kv_heads * T * hs;
    var b = Math.min(K.flash_block, T);
    var tile = fp32 * B * nh * b * b;
    var base = fp32 * (qEl + 2 * kvEl) + fp32 * B * nh * T;
    if (cb === fp32) {
      return base + K.flash_tiles.loop * tile;
    }
    var blocks = fp32 * (B * nh * b * hs + 2 * B * cfg.kv_heads * b * hs); // Q_i, K_j, V_j
    var dO = fp32 * qEl;
    var loop = base + dO + blocks + K.flash_tiles.loop * tile;
    var end = base + dO + blocks + K.flash_tiles.end * tile + cb * (qEl + 2 * kvEl);
    return Math.max(loop, end);
  }

  function bytesOf(tensors, scope) {
    return sum(tensors.filter(function (t) { return scope === null || t.scope === scope; })
               .map(function (t) { return t.bytes; }));
  }

  /* head_peaks: what the head and the loss hold at the forward's and the backward's highest
     points; whole, the logits (and their fp32 copy), then log-softmax's two fp32 gradients;
     chunked (chunked_head_peaks), one chunk of ceil(B*T / K) tokens at a time. */
  function headPeaks(cfg, B, T, precision, chunks, K) {
    var V = cfg.vocab_size, C = cfg.d_model, BT = B * T, f = K.bytes.fp32;
    var cb = K.compute_bytes[precision], pb = K.param_bytes[precision];
    if (chunks <= 1) {
      return [BT * V * cb + (cb !== f ? BT * V * f : 0), 2 * BT * V * f];
    }
    var n = Math.ceil(BT / chunks);
    var wCast = cb !== pb ? V * C * cb : 0; // autocast: the weight in 16 bits, once per pass
    var hCast = cb !== pb ? n * C * cb : 0;
    // per row: the logits (and their fp32 copy), the log-sum-exp's two temporaries
    var fwdRows = cb === f ? V * f + 2 * f : V * cb + V * f + f;
    var bwdRows = cb === f ? 2 * V * f + 2 * f : 2 * V * f + V * cb + 2 * f;
    var atSoftmax = n * bwdRows;
    var atWeightGrad = 2 * n * f + n * V * cb + V * C * cb + (cb !== f ? V * C * f : 0);
    return [wCast + n * fwdRows + f, // + the running total
            BT * C * pb + V * C * f + wCast + hCast + Math.max(atSoftmax, atWeightGrad)];
  }

  /* activation_peaks for the page's two plans, none and full checkpointing: [forward,
     backward] activation-side bytes at their highest points, the saved bytes A on the device,
     and the bytes activation offloading keeps on the host (offloaded_activation_bytes). */
  function activationPeaks(cfg, s, tensors, K, ringBlockTensors) {
    var B = s.batch_size;
    var T = s.seq_len;
    var BT = B * T;
    var L = cfg.n_layer;
    var ckpt = s.checkpointing;
    var precision = s.precision;
    var cb = K.compute_bytes[precision];
    var pb = K.param_bytes[precision];
    var fp32 = K.bytes.fp32;
    var d = dims(cfg, s, K);
    var modelLevel = bytesOf(tensors, "model");
    var A = modelLevel + bytesOf(tensors, "head") + L * bytesOf(tensors, "layer");
    var block = ringBlockTensors || blockTensors(cfg, s, d, K); // the full, recomputed block
    var blockBytes = bytesOf(block, null);
    var xIn = BT * cfg.d_model * pb; // a checkpointed block's input: the residual stream
    // Saved under a block when its backward runs (its own input included), and in the forward.
    // Offloaded (_saved_below), every block's unit is on the host but the one in use.
    var offload = !!s.offload_activations;
    var unit = ckpt ? xIn : blockBytes;
    var offloaded = offload ? L * unit : 0;
    A -= offloaded;
    var below = function (layer) { return (ckpt ? xIn : 0) + (offload ? 0 : layer * unit); };
    var head = headPeaks(cfg, B, T, precision, s.loss_chunks || 1, K);
    var castBytes = bytesOf(block.filter(function (t) { return t.stage === "casts"; }), null);

    // Forward: everything saved, plus the logits (and their fp32 copy) during the loss; under
    // autocast, each checkpointed block's weight casts until autocast exits.
    // Offloaded blocks' weight casts stay in autocast's cache, on the device, until it exits.
    var fwd = A + head[0] + (offload && !ckpt ? L * castBytes : 0);
    if (ckpt) {
      var casts = L * castBytes;
      fwd += casts;
      // checkpointed_block_peak: the last block's MLP while it runs (its tensors kept by no one),
      // before its down projection's 16-bit weight copy exists.
      var normOut = precision.indexOf("-mixed") >= 0 ? fp32 : pb;
      var wide = cfg.style === "llama" ? 3 : 2;
      var down = casts > 0 ? cfg.ffn_dim * cfg.d_model * K.bytes.bf16 : 0;
      fwd = Math.max(fwd, modelLevel + below(L - 1) + casts - down +
                     wide * BT * cfg.ffn_dim * cb + BT * cfg.d_model * (pb + normOut));
    }
    var softmaxAt = null; // [bytes of the block saved up to its softmax, bytes of the scores]
    var before = 0;
    block.forEach(function (t) {
      before += t.bytes;
      if (softmaxAt === null && t.role === "softmax") { // CUDA autocast: an fp32 copy too
        var scores = B * cfg.n_head * T * T * cb;
        softmaxAt = [before, t.bytes !== scores ? scores + B * cfg.n_head * T * T * fp32 : scores];
      }
    });
    if (softmaxAt !== null) { // the last block's softmax, its masked scores alive beside it
      fwd = Math.max(fwd, modelLevel + below(L - 1) + softmaxAt[0] + softmaxAt[1]);
    }

    // Backward: at its start the fp32 gradients of log-softmax's output and input; then each
    // saved tensor's backward, walked through the last and the first block.
    var bwd = A + head[1];
    var g = paramGroups(cfg, K);
    var gBlock = pb * sum(g.block);
    var gHead = pb * sum(g.head);
    var freshGrad = pb * Math.max.apply(null, g.block);
    var inBlock = cfg.moe ? expertGradsInBlock(cfg, precision, K) : {};
    var grads = cfg.moe ? {} : styleTables(cfg, K).grads_in_block[precision];
    Object.keys(grads).forEach(function (stage) {
      inBlock[stage] = [poly(grads[stage][0], d), poly(grads[stage][1], d)];
    });
    var dx = BT * cfg.d_model * pb; // gradient of the residual stream
    var accumulating = s.grad_accum_steps > 1;
    [0, L - 1].forEach(function (layer) {
      var done = accumulating ? freshGrad : gHead + (L - 1 - layer) * gBlock;
      var under = below(layer);
      if (ckpt && softmaxAt !== null) { // the recomputed forward's softmax
        bwd = Math.max(bwd, modelLevel + under + softmaxAt[0] + softmaxAt[1] + done + dx);
      }
      var prefix = 0;
      block.forEach(function (t) {
        if (t.stage === "casts") { // freed one Linear at a time: counted per stage
          return;
        }
        prefix += t.bytes;
        var gradsDone = accumulating ? 0 : inBlock[t.stage][0];
        // Inside attention, the gradient of its output is alive beside the residual's.
        var dOut = t.stage === "attention" ? BT * cfg.d_model * cb : 0;
        // The gradient of what consumed it: its own size, (B, T, C) for an output Linear.
        var consumerGrad = t.role === "linear input" ? BT * cfg.d_model * cb : t.bytes;
        if (cfg.attention === "flash" && t.role === "logsumexp") {
          consumerGrad = flashBackwardWorkspace(cfg, B, T, precision, K) - t.bytes;
        } else if (t.role === "product factor") { // both factors' gradients at once
          consumerGrad = 2 * t.bytes;
        }
        var castsAlive = inBlock[t.stage][1];
        if (offload && !ckpt) { // on the host, but for the one in use
          prefix = t.bytes;
          castsAlive = 0;
        }
        bwd = Math.max(bwd, modelLevel + under + prefix + castsAlive + done + gradsDone +
                       dx + dOut + t.bytes + consumerGrad);
      });
    });
    return [fwd, bwd, A, offloaded];
  }

  function checkContextParallel(N, T) { // memlab.memory.context: the zig-zag cuts T into 2N chunks
    var bad = typeof N !== "number" || !Number.isInteger(N) || N < 1;
    return bad || (N > 1 && T % (2 * N) !== 0) ? fail(bad
      ? "context_parallel must be a positive whole number of ranks, got " + pyRepr(N)
      : "context parallelism over " + N + " ranks (zig-zag) cuts the sequence into " + 2 * N +
        " equal chunks: seq_len must be a multiple of " + 2 * N + ", got " + pyRepr(T)) : N;
  }

  function ringBlock(cfg, s, K) { // ring_block: the attention core as ring_core_tensors
    var B = s.batch_size, n = s.seq_len, cb = K.compute_bytes[s.precision], hs = cfg.head_dim;
    var q = B * cfg.n_head * n * hs * cb, kv = B * cfg.kv_heads * n * hs * cb;
    var core = [["q", q], ["k", kv], ["v", kv], ["positions", n * K.bytes.int64], ["output", q],
                ["log-sum-exp", B * cfg.n_head * n * K.bytes.fp32],
                ["o_proj input", B * n * cfg.d_model * cb]
    ].map(function (r) {
      return { name: "ring " + r[0], scope: "layer", stage: "attention", role: null, bytes: r[1] };
    });
    var block = blockTensors(cfg, s, dims(cfg, s, K), K);
    return [].concat.apply([], block.map(function (t) { // RoPE's casts stay
      return t.stage === "attention" && t.name.indexOf("RoPE") !== 0 ? core.splice(0) : [t];
    }));
  }

  function ringPeaks(cfg, s, block, N, modelLevel, K) { // ring_peaks, with ring_transient_bytes
    var B = s.batch_size, n = s.seq_len, L = cfg.n_layer, C = cfg.d_model, f = K.bytes.fp32;
    var hs = cfg.head_dim, cb = K.compute_bytes[s.precision], pb = K.param_bytes[s.precision];
    var up = cb !== f;
    var S = B * cfg.n_head * n * n * f, Q = B * cfg.n_head * n * hs, KV = B * cfg.kv_heads * n * hs;
    var R = B * cfg.n_head * n * f, held = N > 1 ? 2 * KV * cb : 0;
    var body = block.filter(function (t) { return t.stage !== "casts"; });
    var names = body.map(function (t) { return t.name; });
    var upTo = function (x) { // weight copies aside
      return bytesOf(body.slice(0, names.indexOf(x) + 1), null);
    };
    var kept = s.checkpointing ? B * n * C * pb : bytesOf(block, null);
    var castB = bytesOf(block, null) - bytesOf(body, null);
    var casts = castB ? (s.checkpointing ? (L - 1) * castB : 0) +
      2 * C * hs * (cfg.n_head + 2 * cfg.kv_heads) : 0;
    var g = paramGroups(cfg, K), d = dims(cfg, s, K), acc = s.grad_accum_steps > 1;
    var att = styleTables(cfg, K).grads_in_block[s.precision].attention;
    var bwd = [0, L - 1].map(function (l) {
      var done = acc ? pb * Math.max.apply(null, g.block)
        : pb * sum(g.head) + (L - 1 - l) * pb * sum(g.block) + poly(att[0], d);
      return modelLevel + l * kept + upTo("ring log-sum-exp") + poly(att[1], d) + done +
        B * n * C * (pb + cb) + 3 * S + n * n + (cfg.kv_heads !== cfg.n_head || up ? 2 * Q * f : 0) +
        (up ? 2 * Q * f : 0) + (KV + Q) * f + R + held + 2 * KV * f;
    });
    return [modelLevel + (L - 1) * kept + casts + upTo("ring v") + 3 * S + n * n + Q * f + 2 * R +
            held + n * K.bytes.int64, Math.max.apply(null, bwd)];
  }

  return {
    MemlabError: MemlabError, fail: fail, sum: sum, product: product, dims: dims, poly: poly,
    styleTables: styleTables, blockTensors: blockTensors, savedTensors: savedTensors,
    paramGroups: paramGroups, paramTensors: paramTensors, paramShapes: paramShapes,
    numParameters: numParameters, bytesOf: bytesOf, headPeaks: headPeaks,
    moeRows: moeRows, activeParameters: activeParameters,
    activationPeaks: activationPeaks, checkContextParallel: checkContextParallel,
    ringBlock: ringBlock, ringPeaks: ringPeaks,
  };
});
