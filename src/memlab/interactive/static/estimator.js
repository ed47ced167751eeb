/* memlab memory estimator (chapter 1, "Where the memory goes").
 *
 * memlab.memory.estimate for a training step, in the browser, with no kernel: an interpreter
 * of tables that Python writes from its own walk (memlab.interactive.walk, committed as
 * static/estimator_walk.json). The tables hold what each block and each step saves for the
 * backward pass (every tensor's element count as a polynomial in the shape symbols, and its
 * dtype as a rule of the switches), the parameter tensors, and the gradients finished at each
 * stage of a block's backward. estimator_activations.js reads the tables and holds the
 * activation side of the peak (the head and the loss, whole or chunked, checkpointing,
 * activation offloading, the ring of context parallelism); this file adds the optimizer's
 * states and scratch, the phases, the config.json reader (mixtures of experts' included) and
 * the page's controls (the levers memlab.moe.estimate_moe lacks turned off for experts), each
 * function naming the Python function it mirrors. Every other number (bytes per dtype and
 * precision, bitsandbytes' blocks, FlashAttention's tiles, the presets, each GPU's usable
 * bytes, the config.json table) comes from Python as JSON
 * (memlab.interactive.estimator.estimator_data). Numbers are written by format.js.
 * Tests run it in Chromium and under Node against memlab.memory.estimate.
 *
 * Exposed as globalThis.memlabEstimator (and module.exports under Node):
 *   estimate(cfg, setting, K)      -> {parameters, phase_peak_bytes, peak_phase, breakdown, ...}
 *   savedTensors(cfg, setting, K)  -> [{name, scope, bytes, stage, role}] in forward order
 *   configFromHF(raw, K, source)   -> a resolved config, or throws {memlab: true, message}
 *   readout(cfg, setting, K)       -> what the page shows: texts and bytes (or {error})
 *   mount(rootElement, K)          binds one estimator rendered by memlab.interactive.estimator
 *   mountById(id)                  the same, finding the root and its JSON data by id
 */
(function (root, factory) {
  "use strict";
  var node = typeof module === "object" && module && module.exports && typeof require === "function";
  var api = factory(node ? require("./format.js") : root.memlabFormat,
                    node ? require("./estimator_activations.js") : root.memlabEstimatorActivations);
  if (node) {
    module.exports = api;
  }
  if (root) {
    root.memlabEstimator = api;
  }
})(typeof globalThis !== "undefined" ? globalThis : typeof window !== "undefined" ? window : this,
   function (format, acts) {
  "use strict";

  var VERSION = 2;
  var pyFixed = format.pyFixed;
  var pyRepr = format.pyRepr;
  var intText = format.intText;

  // the walk's tables and the activation side of the peak (estimator_activations.js)
  var fail = acts.fail, sum = acts.sum, product = acts.product, bytesOf = acts.bytesOf;
  var savedTensors = acts.savedTensors, paramTensors = acts.paramTensors;
  var paramShapes = acts.paramShapes, numParameters = acts.numParameters;
  var activationPeaks = acts.activationPeaks, ringBlock = acts.ringBlock;
  var activeParameters = acts.activeParameters;
  var ringPeaks = acts.ringPeaks, checkContextParallel = acts.checkContextParallel;

  /* ---- optimizer states and scratch (memlab.memory.estimator) ----------------------- */

  function isAdam(optimizer) {
    return optimizer === "adamw" || optimizer === "adam";
  }

  /* state_bytes: Adam's two moments (and fp32 step counters, on the host on CUDA unless
     fused), SGD's momentum, or bitsandbytes' 8-bit states with one fp32 absmax per block
     (small tensors keep two fp32 states; two fp32 quantization maps shared by all). */
  function optimizerStateBytes(cfg, K, precision, optimizer, impl, device) {
    var pb = K.param_bytes[precision];
    var fp32 = K.bytes.fp32;
    var tensors = paramTensors(cfg, K);
    var n = sum(tensors.map(function (tk) { return tk[0] * tk[1]; }));
    if (isAdam(optimizer)) {
      var nTensors = sum(tensors.map(function (tk) { return tk[1]; }));
      return 2 * pb * n + (device === "cpu" || impl === "fused" ? fp32 * nTensors : 0);
    }
    if (optimizer === "sgd-momentum") {
      return pb * n;
    }
    if (optimizer === "sgd") {
      return 0;
    }
    if (optimizer === "adamw-bf16-moments") { return 2 * K.bytes.bf16 * n; }  /* + a Python int */
    if (optimizer === "adafactor") {  /* a row and a column per matrix, a vector's own size */
      return sum(paramShapes(cfg, K).map(function (tk) {
        var t = tk[0], m = t.length, c = device === "cpu" ? fp32 : 0;
        return tk[1] * (c + pb * (m === 1 ? t[0] : product(t.slice(0, m - 2)) * (t[m - 2] + t[m - 1])));
      }));
    }
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
    return total + (anyLarge ? 2 * K.bnb.map_entries * fp32 : 0);
  }

  /* step_scratch_bytes: foreach Adam(W) holds one parameter-sized scratch list; the for-loop
     version two of the largest tensor; fused kernels, SGD and 8-bit AdamW update in place. */
  function optimizerStepScratchBytes(cfg, K, precision, optimizer, impl) {
    var pb = K.param_bytes[precision];
    var fp32 = K.bytes.fp32;
    if (optimizer === "adafactor") { return adafactorScratchBytes(paramShapes(cfg, K), pb, impl); }
    if (optimizer === "adamw-bf16-moments") {  /* fp32 moments, and gradient when 16-bit */
      return (2 * fp32 + (pb < fp32 ? fp32 : 0)) *
        Math.max.apply(null, paramTensors(cfg, K).map(function (tk) { return tk[0]; }));
    }
    if (!isAdam(optimizer) || impl === "fused") {
      return 0;
    }
    var tensors = paramTensors(cfg, K);
    if (impl === "foreach") {
      return pb * sum(tensors.map(function (tk) { return tk[0] * tk[1]; }));
    }
    return 2 * pb * Math.max.apply(null, tensors.map(function (tk) { return tk[0]; }));
  }

  /* adafactor_scratch_bytes: foreach holds all matrices' variance estimates, then the vectors'
     beside them; the for-loop keeps the last tensor's temporaries until the next replaces them. */
  function adafactorScratchBytes(tensors, pb, impl) {
    var order = [].concat.apply([], tensors.map(function (tk) { return Array(tk[1]).fill(tk[0]); }));
    if (impl === "foreach") {
      var mats = order.filter(function (t) { return t.length > 1; }), matFirst = order[0].length > 1;
      var groups = [sum(mats.map(product)), sum(order.map(function (t) { return t.length > 1 ? 0 : t[0]; }))];
      return pb * (groups[matFirst ? 0 : 1] + Math.max(matFirst ? mats.length : 0, groups[matFirst ? 1 : 0]));
    }
    var row = 0, col = 0, sq = 0, est = 0, peak = 0;
    order.forEach(function (t) {
      var m = t.length, n = product(t), r = product(t.slice(0, m - 1)), c = n / t[m - 2];
      peak = m > 1
        ? Math.max(peak, row + r + col + sq + est, r + col + c + sq + est, r + c + sq + est + n + 1)
        : Math.max(peak, row + col + (sq ? 2 * sq : 0) + est + n, row + col + 2 * n + est);
      if (m > 1) { row = r; col = c; } else { sq = n; }
      est = n;
    });
    return pb * peak;
  }

  /* ---- the estimate (memlab.memory.estimator.estimate and step_estimate) ------------ */

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

  /* The switches checked as memlab.model.step.StepSpec checks them. */
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
    if (/^(adamw-8bit|adamw-bf16-moments|adafactor)$/.test(s.optimizer) && s.optimizer_impl === "fused") {
      fail("optimizer '" + s.optimizer + "' " + (s.optimizer === "adamw-8bit" ? "has its own kernels" :
           "has no fused kernel") + "; accepted optimizer_impl for it: " +
           K.optimizer_impls.filter(function (i) { return i !== "fused"; }).join(", "));
    }
    positiveInt("grad_accum_steps", s.grad_accum_steps);
    var chunks = s.loss_chunks, tokens = s.batch_size * s.seq_len; // check_loss_chunks
    if (typeof chunks !== "number" || !Number.isInteger(chunks) || chunks < 1 || chunks > tokens) {
      fail("loss_chunks must be a whole number from 1 to " + intText(tokens) + ", got " +
           pyRepr(chunks));
    }
    if (typeof s.offload_activations !== "boolean") {
      fail("offload_activations must be True or False, got " + pyRepr(s.offload_activations));
    }
  }

  /* A mixture of experts: the levers memlab.moe.estimate_moe does not model yet must be off
     (memlab.interactive.estimator_moe.check_levers). */
  function checkLevers(cfg, s, K) {
    K.moe.unmodelled.forEach(function (lever) {
      var v = s[lever.role] === undefined ? lever.off : s[lever.role];
      if ((typeof lever.off === "boolean" ? !!v : v) !== lever.off) {
        fail(lever.words + " is not modelled for a mixture of experts yet (" + cfg.name +
             "): got " + lever.role + " " + pyRepr(v) + "; accepted: " + pyRepr(lever.off));
      }
    });
  }

  function estimate(cfg0, setting0, K) {
    var setting = Object.assign({ loss_chunks: 1, offload_activations: false }, setting0);
    checkSetting(cfg0, setting, K);
    if (cfg0.moe) { // memlab.moe.estimate_moe: the dense step's phases, over the MoE block
      checkLevers(cfg0, setting, K);
    }
    var cfg = Object.assign({}, cfg0, { attention: setting.attention });
    var ranks = checkContextParallel(setting.context_parallel || 1, setting.seq_len); // T/N tokens each
    if (ranks > 1 && setting.offload_activations) {
      fail("context parallelism with activation offloading is not modelled: estimate one of " +
           "them (context_parallel or offload_activations)");
    }
    var s = Object.assign({}, setting, { checkpointing: !!setting.checkpointing,
                                         seq_len: setting.seq_len / ranks,
                                         chunked_loss: setting.loss_chunks > 1 }); // the walk's switch
    var precision = s.precision;
    var pb = K.param_bytes[precision];
    var accumulating = s.grad_accum_steps > 1;
    var n = numParameters(cfg, K);
    var P = pb * n;
    var G = P;
    var S = optimizerStateBytes(cfg, K, precision, s.optimizer, s.optimizer_impl, s.device);
    var saved = savedTensors(cfg, s, K), block = ranks > 1 ? ringBlock(cfg, s, K) : null; // the ring's
    saved = block && !s.checkpointing // ring_saved_tensors
      ? saved.filter(function (t) { return t.scope !== "layer"; }).concat(block) : saved;
    var peaks = activationPeaks(cfg, s, saved, K, block);
    var ring = ranks > 1 ? ringPeaks(cfg, s, block, ranks, bytesOf(saved, "model"), K) : [0, 0];
    peaks = [Math.max(peaks[0], ring[0]), Math.max(peaks[1], ring[1]), peaks[2], peaks[3]];
    var A = peaks[2];
    var tokens = 2 * s.batch_size * s.seq_len * K.bytes.int64; // input ids and targets
    // A tied embedding gets two gradients, summed at the very end of the backward pass; with
    // accumulation the new embedding gradient is a temporary added into .grad.
    var VC = cfg.vocab_size * cfg.d_model * pb;
    var end = P + S + G + tokens + (accumulating ? (cfg.tied ? 3 : 1) : (cfg.tied ? 2 : 0)) * VC;
    // step_estimate: with accumulation, earlier micro-batches' gradients stay alive.
    var gLive = accumulating ? G : 0;
    var base = P + S + gLive + tokens;
    var phases = {
      forward: base + peaks[0],
      backward: Math.max(base + peaks[1], end),
      optimizer: P + S + G + tokens +
        optimizerStepScratchBytes(cfg, K, precision, s.optimizer, s.optimizer_impl),
    };
    var peakPhase = K.phases[0];
    K.phases.forEach(function (p) {
      if (phases[p] > phases[peakPhase]) {
        peakPhase = p;
      }
    });
    function cats(grads, acts, total) {
      var c = { parameters: P, gradients: grads, optimizer_states: S, activations: acts, other: tokens };
      c.temporaries = total - (P + grads + S + acts + tokens);
      return c;
    }
    var startWins = base + peaks[1] >= end; // the backward's high point is before the gradients grow
    var breakdown = {
      forward: cats(gLive, A, phases.forward),
      backward: startWins ? cats(gLive, A, phases.backward) : cats(G, 0, phases.backward),
      optimizer: cats(G, 0, phases.optimizer),
    };
    return { // step_bytes: the fields of memlab.model.step.STEP_BYTES
      parameters: n,
      parameters_bytes: P,
      gradients_bytes: G,
      optimizer_states_bytes: S,
      saved_activations_bytes: A,
      activations_at_peak_bytes: breakdown[peakPhase].activations,
      temporaries_bytes: breakdown[peakPhase].temporaries,
      other_bytes: breakdown[peakPhase].other,
      peak_bytes: phases[peakPhase],
      peak_phase: peakPhase,
      phase_peak_bytes: phases,
      breakdown: breakdown,
      offloaded_bytes: peaks[3], // on the host (the estimate's setup)
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

  function truthy(v) { // Python's truth of a JSON value
    return v !== null && v !== undefined && v !== false && v !== 0 && v !== "" &&
      !(Array.isArray(v) && v.length === 0) &&
      !(typeof v === "object" && !Array.isArray(v) && Object.keys(v).length === 0);
  }

  /* The experts of a mixture-of-experts family's config.json (memlab.model.config._hf_moe),
     checked as MoEConfig checks them; null for a dense one. */
  function hfExperts(raw, mtype, K, source) {
    var M = K.moe;
    if (!has(M.fields, mtype)) {
      return null;
    }
    var step = has(raw, "decoder_sparse_step") ? raw.decoder_sparse_step : 1;
    var only = has(raw, "mlp_only_layers") ? raw.mlp_only_layers : null;
    if (M.sparse_step_families.indexOf(mtype) >= 0 && ((step !== 1 && step !== true) || truthy(only))) {
      fail(source + " makes some blocks dense (decoder_sparse_step " + pyRepr(step) +
           ", mlp_only_layers " + pyRepr(only) + "): the book's model has experts in every " +
           "block; accepted: decoder_sparse_step 1 and no mlp_only_layers");
    }
    var m = Object.assign({ shared_d_ff: 0, shared_gate: false, capacity_factor: null },
                          M.fixed[mtype], readFields(raw, M.fields[mtype], K, source).values);
    m.norm_topk_prob = m.norm_topk_prob === null ? false : m.norm_topk_prob;
    if (m.top_k > m.experts) {
      fail(source + ": moe top_k (" + m.top_k + ") must be at most the experts (" + m.experts + ")");
    }
    var a = m.aux_loss_coef;
    if (!(a >= 0) || !isFinite(a)) {
      fail(source + ": moe aux_loss_coef must be a number >= 0, got " + pyRepr(a));
    }
    return m;
  }

  /* Each field's value (checked, or its default) and the key it was read from (_hf_fields). */
  function readFields(raw, fields, K, source) {
    var values = {};
    var used = {};
    fields.forEach(function (f) {
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
    return { values: values, used: used };
  }

  /* memlab.model.config.hf_model_type: model_type, else the one architectures[0] implies. */
  function hfModelType(raw, K) {
    if (has(raw, "model_type")) {
      return raw.model_type;
    }
    var archs = has(raw, "architectures") ? raw.architectures : null;
    if (Array.isArray(archs) && archs.length && typeof archs[0] === "string" &&
        has(K.hf.architectures, archs[0])) {
      return K.hf.architectures[archs[0]];
    }
    return null;
  }

  function noFamily(source, raw, K) { // memlab.model.config._no_family
    var styles = Object.keys(K.hf.styles);
    if (has(raw, "model_type")) {
      return source + " has model_type " + pyRepr(raw.model_type) + "; accepted: " +
        styles.join(", ");
    }
    var archs = Object.keys(K.hf.architectures).filter(function (a) {
      return has(K.hf.styles, K.hf.architectures[a]);
    });
    return source + " has no model_type and its architectures name no family read; accepted " +
      "model_type: " + styles.join(", ") + "; or architectures: " + archs.join(", ");
  }

  function configFromHF(raw, K, source) {
    if (raw === null || typeof raw !== "object" || Array.isArray(raw)) {
      fail(source + " must hold a JSON object");
    }
    var mtype = hfModelType(raw, K);
    var styles = Object.keys(K.hf.styles);
    if (mtype === null) {
      fail(noFamily(source, raw, K));
    }
    if (typeof mtype === "string" && !has(K.hf.styles, mtype) && K.moe.expert_keys.some(function (k) {
      return has(raw, k);
    })) { // estimator_moe.refuse_other_moe
      fail(source + " has model_type " + pyRepr(mtype) + ", a mixture of experts this page does " +
           "not read; accepted mixtures of experts: " + Object.keys(K.moe.styles).join(", "));
    }
    if (typeof mtype !== "string" || !has(K.hf.styles, mtype)) {
      fail(noFamily(source, raw, K));
    }
    var style = K.hf.styles[mtype];
    if (style === "llama") {
      K.hf.bias_flags.forEach(function (flag) {
        var v = has(raw, flag) ? raw[flag] : null;
        if (truthy(v)) {
          fail(source + " sets " + flag + " to " + pyRepr(v) + ": biases in attention or MLP, " +
               "which the book's Llama-style model does not have; accepted: false or absent");
        }
      });
    }
    var read = readFields(raw, K.hf.fields[style], K, source);
    var values = read.values;
    var used = read.used;
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
    if (has(raw, "use_sliding_window") && truthy(raw.use_sliding_window)) {
      fail(source + " sets use_sliding_window to " + pyRepr(raw.use_sliding_window) + ": the " +
           "book's model attends to every earlier token; accepted: false or absent");
    }
    var name = typeof raw._name_or_path === "string" && raw._name_or_path ? raw._name_or_path
      : mtype + " (" + values.n_layer + " layers, width " + C + ")";
    var tied = values.tie_embeddings === null ? K.hf.tied_by_default[style] : values.tie_embeddings;
    // A GPT-2 config may leave n_inner null: the MLP is then a fixed multiple of the width.
    var ffn = values.d_ff === null || values.d_ff === undefined ? K.hf.gpt2_ffn_per_width * C
      : values.d_ff;
    var experts = hfExperts(raw, mtype, K, source);
    var cfg = {
      name: name, style: style, vocab_size: values.vocab_size, n_layer: values.n_layer,
      n_head: nh, kv_heads: nkv === null ? nh : nkv, d_model: C, head_dim: hs, ffn_dim: ffn,
      max_seq_len: values.max_seq_len, tied: tied, attention: K.hf.attention,
    };
    return experts === null ? cfg : Object.assign(cfg, { qkv_bias: false }, K.moe.config_fixed[mtype], {
      moe: { experts: experts.experts, top_k: experts.top_k, d_ff: experts.d_ff,
             shared_d_ff: experts.shared_d_ff, shared_gate: experts.shared_gate,
             norm_topk_prob: experts.norm_topk_prob, capacity_factor: experts.capacity_factor,
             aux_loss_coef: experts.aux_loss_coef },
    });
  }

  /* ---- what the page shows ------------------------------------------------------------ */

  function amount(bytes, unit, K) {
    return pyFixed(bytes / K.units[unit], K.decimals) + " " + unit;
  }

  function modelLabel(cfg, K) {
    return cfg.name + " (" + pyFixed(numParameters(cfg, K) / K.billion, K.decimals) + "B" +
      (cfg.moe ? ", " + pyFixed(activeParameters(cfg, K) / K.billion, K.decimals) + "B active" : "") +
      ")";
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
      var active = cfg.moe ? activeParameters(cfg, K) : null;
      var setup = cfg.name + ": " + intText(est.parameters) + " parameters" +
        (active === null ? "" : ", " + intText(active) + " active") + "; batch " +
        s.batch_size + " \u00d7 " + intText(s.seq_len) + " tokens, " + s.precision + ", " +
        s.optimizer + " (" + s.optimizer_impl + "), " + s.attention + " attention" +
        (s.checkpointing ? ", checkpointing" : "") +
        (s.grad_accum_steps > 1 ? ", " + s.grad_accum_steps + " accumulation steps" : "") +
        (s.context_parallel > 1 ? ", one of " + s.context_parallel + " context-parallel ranks" : "") +
        (s.loss_chunks > 1 ? ", the loss in " + s.loss_chunks + " chunks" : "") +
        (s.offload_activations ? ", " + amount(est.offloaded_bytes, unit, K) +
         " of activations offloaded to the host" : "") +
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
      var out = {
        error: null,
        model: cfg.name,
        parameters: est.parameters,
      };
      if (active !== null) {
        out.active_parameters = active;
      }
      return Object.assign(out, {
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
      });
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
     "checkpointing", "grad_accum_steps", "device", "context_parallel", "loss_chunks",
     "offload_activations"].forEach(function (k) {
      controls[k] = q(rootEl, k);
    });
    var pasteText = q(rootEl, "config-text");
    var pasteButton = q(rootEl, "config-apply");
    var pasteStatus = q(rootEl, "config-status");
    var pastedOption = rootEl.querySelector('option[value="' + K.pasted_key + '"]');
    var results = q(rootEl, "results");
    var errorEl = q(rootEl, "error");
    var leversNote = q(rootEl, "levers-note");

    /* A mixture of experts: the levers its estimate does not model are off and disabled, and
       the page says why; a dense model gets them back. */
    function syncLevers(cfg) {
      var moe = !!(cfg && cfg.moe);
      K.moe.unmodelled.forEach(function (lever) {
        var el = controls[lever.role];
        if (moe) {
          if (el.type === "checkbox") {
            el.checked = lever.off;
          } else {
            el.value = String(lever.off);
          }
        }
        el.disabled = moe;
      });
      leversNote.textContent = moe ? cfg.name + " " + K.moe.note : "";
      leversNote.hidden = !moe;
    }

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
        device: controls.device.value, context_parallel: typedInt(controls.context_parallel.value),
        loss_chunks: typedInt(controls.loss_chunks.value),
        offload_activations: controls.offload_activations.checked,
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
      syncLevers(cfg);
      var r = readout(cfg, setting(), K);
      show(r);
      return r;
    }

    /* A paste refused: its one-line error, and no numbers left on show from before it (they
       would read as the refused config's); changing a control shows the menu's model again. */
    function pasteFailed(message) {
      pasteStatus.textContent = message;
      pasteStatus.setAttribute("data-state", "error");
      show({ error: message });
    }

    function applyPasted() {
      var raw;
      try {
        raw = JSON.parse(pasteText.value);
      } catch (err) {
        pasteFailed("memlab: error: " + K.pasted_source + " is not valid JSON (" + err.message +
                    ")");
        return;
      }
      try {
        pasted = configFromHF(raw, K, K.pasted_source);
      } catch (err) {
        if (!(err && err.memlab)) {
          throw err;
        }
        pasteFailed("memlab: error: " + err.message);
        return;
      }
      pastedOption.disabled = false;
      pastedOption.textContent = "pasted: " + modelLabel(pasted, K);
      controls.model.value = K.pasted_key;
      pasteStatus.textContent = "using " + pasted.name + ": " + intText(numParameters(pasted, K)) +
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
