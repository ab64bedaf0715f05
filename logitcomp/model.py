"""`ComposedModelForCausalLM`: a base and its experts as one causal LM whose logits are composed log-probs.

Row layout of one forward, for an input of B rows, LoRA experts e_1..e_m and full experts f_1..f_n:
    one base forward on (1 + m)·B rows [base | e_1 | ... | e_m] (grouped LoRA, one KV cache),
    plus one forward of B rows per full expert (its own weights and KV cache);
    then log p̂ = compose_logprobs(base, experts in composition order).
"""

from __future__ import annotations

import copy
import logging
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
from peft import PeftModel
from transformers import CompileConfig, GenerationMixin, PreTrainedModel

from . import persistence
from .config import CompositionConfig
from .grouped_lora import LoraStack, grouped_lora
from .gated import gated_forward
from .head import fast_head
from .layout import RowLayout
from .loading import LoadOptions, refuse_unknown
from .ops import Composer, LogitsWatch, check_logits, entropy, kl_divergence
from .outputs import ComposedCache, ComposedCausalLMOutput, CompositionTrace
from .routing import Router, last_hidden
from .scoring import forward_in_chunks, scoring_chunk

log = logging.getLogger(__name__)
SCORING_BUDGET = 1 << 27  # elements (512 MiB of fp32 logits) of the k + 1 models' logits in one scoring forward
# transformers' generate hands its own arguments on to every forward call (models take **kwargs)
GENERATE_ONLY = frozenset({"tokenizer", "assistant_tokenizer", "assistant_model", "streamer"})


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) positions counted from each row's first real token, so left padding does not shift them."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def _positions(attention_mask: torch.Tensor | None, past: int, length: int, device) -> torch.Tensor:
    """Position ids of the new tokens (the last `length` of past + new)."""
    if attention_mask is None:
        return torch.arange(past, past + length, device=device).unsqueeze(0)  # (1, T)
    return position_ids(attention_mask)[:, -length:]  # (B, T)


class ComposedModelForCausalLM(PreTrainedModel, GenerationMixin):
    """A base model and its experts composed in probability space, usable like a transformers LM.

    Build it with `logitcomp.compose(peft_model, {...})`, `from_experts(base_path, {...})` or
    `from_pretrained(saved_dir)`; `generate` is transformers' own (greedy, sampling, stop strings,
    stopping criteria, left-padded batches), applied to the composed distribution.
    """

    main_input_name = "input_ids"
    # attention runs inside the wrapped models; these only let PreTrainedModel accept their config
    _supports_sdpa = _supports_flash_attn = _supports_flex_attn = _supports_attention_backend = True

    def __init__(self, model, experts: list[str], full_experts: dict | None = None,
                 composition: CompositionConfig | None = None, sources: dict | None = None):
        hf_model = model.get_base_model() if isinstance(model, PeftModel) else model
        super().__init__(copy.deepcopy(hf_model.config))
        full_experts = dict(full_experts or {})
        lora = [e for e in experts if e not in full_experts]
        if len(set(experts)) != len(experts):
            raise ValueError(f"experts: names must be unique, got {experts}")
        if not experts:
            raise ValueError("experts: expected at least one expert")
        vocab = hf_model.config.get_text_config().vocab_size
        for name, expert in full_experts.items():  # checked here, not at every step
            if expert.config.get_text_config().vocab_size != vocab:
                raise ValueError(f"expert {name!r}: a vocabulary of {expert.config.get_text_config().vocab_size} tokens, the base {vocab}")
        held = set(model.peft_config) if isinstance(model, PeftModel) else set()
        missing = [e for e in lora if e not in held]
        if missing:
            raise ValueError(f"expert {missing[0]!r}: the peft model holds no such adapter; it holds {sorted(held)}")
        for name in lora:  # whole trained copies of modules run for every row of a batch, not per row block
            for option in ("modules_to_save", "trainable_token_indices"):
                if getattr(model.peft_config[name], option, None):
                    raise ValueError(f"expert {name!r}: {option}={getattr(model.peft_config[name], option)!r} cannot be composed "
                                     "row by row; merge this expert (bridge.task_arithmetic) or train it without that option")
        self.model = model
        self.full_experts = torch.nn.ModuleDict(full_experts)
        self.experts = list(experts)
        self.lora_experts = lora
        self._hf_model = hf_model
        self._mask_buffers = {}
        self.composition = composition or CompositionConfig()  # checked and compiled into a Composer (the setter)
        self.sources = dict(sources or {})
        if "base" not in self.sources and Path(hf_model.config._name_or_path or "").is_dir():
            # a base loaded by a relative path: resolved now, against the folder it was loaded from
            self.sources["base"] = str(Path(hf_model.config._name_or_path).resolve())
        self.generation_config = copy.deepcopy(hf_model.generation_config)
        self._lora = LoraStack(model, lora) if isinstance(model, PeftModel) else None
        self._routing = False  # True while a `generate` call or a chunked scoring holds the routing for all its forwards
        # a forward that scores every position of a sequence (lm-eval's loglikelihood, `labels`) runs in position
        # chunks whose k + 1 logits tensors hold at most this many elements (None: one forward, as many as it takes)
        self.scoring_budget: int | None = SCORING_BUDGET
        # an expert whose weight (or held gate) is 0 for an input is not computed for it (`logitcomp.layout`); False: every
        # expert runs for every input, as before (the benchmarks' "before")
        self.skip_unused_experts = True
        self._layouts = {}  # (batch, kept experts, device) -> RowLayout (`_fixed_layout`)
        self._rows: RowLayout | None = None  # the rows of the forward being run, read by the grouped-LoRA hooks
        self._watch: LogitsWatch | None = None  # set during `generate`: the logits checks of its steps, read once at the end
        self._eos = ((), torch.zeros(0, dtype=torch.long))  # (ids, the same ids as a tensor on the last device used)
        self.eval()

    @property
    def composition(self) -> CompositionConfig:
        """The composition options; assigning new ones checks them and compiles them once."""
        return self._composition

    @composition.setter
    def composition(self, config: CompositionConfig) -> None:
        config.check_experts(self.experts)
        masks = self._build_masks(config.masks)
        self._composer = Composer.build([config.weight(e) for e in self.experts], floor=config.floor, rule=config.rule,
                                        rule_params=config.rule_params, eos_policy=config.eos_policy, masked=bool(masks))
        # per-step constants live on the model's device and follow `.to()` (buffers): a decoding step
        # copies nothing from the host (masks are bool, so `.to(dtype)` leaves them as they are)
        self.router = None if config.routing is None else Router.from_config(config.routing, self.experts).to(self._hf_model.device)
        for buffer in self._mask_buffers.values():
            delattr(self, buffer)
        self._mask_buffers = {}
        for i, (name, mask) in enumerate(masks.items()):
            self.register_buffer(f"mask_{i}", mask.to(self._hf_model.device), persistent=False)
            self._mask_buffers[name] = f"mask_{i}"
        self._composition = config
        self._subsets = {}  # kept experts -> their composer (`_subset`)

    def get_input_embeddings(self) -> torch.nn.Module:
        """The base model's token embeddings (shared by every LoRA row)."""
        return self._hf_model.get_input_embeddings()

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # generate must not make its own cache: forward makes a ComposedCache

    def _prepare_cache_for_generation(self, generation_config, model_kwargs, generation_mode, batch_size, max_cache_length):
        """transformers' hook for `generate`'s cache: `cache_implementation="static"` gets a static ComposedCache
        (the grouped rows' and each full expert's caches fixed at `max_cache_length`); otherwise forward makes a
        dynamic one. With a static cache transformers compiles the decoding step on GPUs (see `generate`)."""
        implementation = generation_config.cache_implementation
        if model_kwargs.get("cache") is not None or not generation_config.use_cache:
            return super()._prepare_cache_for_generation(generation_config, model_kwargs, generation_mode, batch_size, max_cache_length)
        if implementation in (None, "dynamic"):
            return None  # forward makes a dynamic ComposedCache
        if implementation != "static":
            raise ValueError(f"cache_implementation: a composed model supports 'static' or 'dynamic', got {implementation!r}")
        length = max(max_cache_length, generation_config.max_cache_len or 0)
        model_kwargs["cache"] = ComposedCache(dict(self.full_experts), self._hf_model.config, length)

    def _build_masks(self, masks_ids: dict[str, list[int]]) -> dict[str, torch.Tensor]:
        """Expert name -> bool (V,) mask of the token ids its log-ratio applies on."""
        vocab = self.config.get_text_config().vocab_size
        masks = {}
        for name, ids in masks_ids.items():
            if ids and max(ids) >= vocab:
                raise ValueError(f"masks[{name!r}]: token id {max(ids)} is outside the vocabulary of {vocab}")
            mask = torch.zeros(vocab, dtype=torch.bool)
            mask[ids] = True
            masks[name] = mask
        return masks

    # ---- forward --------------------------------------------------------------------------
    def forward(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None = None,
        cache: ComposedCache | None = None,
        position_ids: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        past_key_values: ComposedCache | None = None,
        logits_to_keep: int = 0,
        labels: torch.LongTensor | None = None,
        output_trace: bool | None = None,
        return_dict: bool = True,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        **kwargs,
    ) -> ComposedCausalLMOutput:
        """Composed log-probs for every position (or the last `logits_to_keep`).

        Args:
            input_ids: (B, T) new tokens; with a cache, the tokens after the cached prefix.
            attention_mask: (B, past + T), 0 on left padding.
            cache: a `ComposedCache` from a previous call (`past_key_values` is accepted too).
            position_ids: (B, T); derived from `attention_mask` when omitted.
            use_cache: return a cache to continue from (default: the base config's `use_cache`).
            output_trace: also return a `CompositionTrace` (default: the composition's `trace`).
            labels: (B, T) token ids (-100: ignored); `loss` is the composed mean NLL, shifted as in transformers.
        """
        refuse_unknown("forward", {k: v for k, v in kwargs.items() if k not in GENERATE_ONLY})
        for name, wanted in (("output_attentions", output_attentions), ("output_hidden_states", output_hidden_states)):
            if wanted:  # generate passes them as False/None; a composition has no single set of them
                raise ValueError(f"{name}: not available from a composed model; call the base or an expert directly")
        cache = cache if cache is not None else past_key_values
        if cache is not None and not isinstance(cache, ComposedCache):
            raise ValueError(f"cache: expected a ComposedCache from a previous call, got {type(cache).__name__}")
        use_cache = self.config.use_cache if use_cache is None else use_cache
        cache = cache if use_cache else None
        batch, length = input_ids.shape
        if length == 0:
            raise ValueError(f"input_ids: expected at least one token per row, got shape {tuple(input_ids.shape)}")
        chunk = scoring_chunk(self, batch, length) if cache is None and not logits_to_keep else length
        layout = self._layout(batch, cache, use_cache, self.composition.trace if output_trace is None else output_trace)
        if layout is None:  # the gates of this forward choose its rows: the base's rows first, then the experts' they keep
            if position_ids is None:
                position_ids = _positions(attention_mask, 0, length, input_ids.device).expand(batch, -1)
            out = gated_forward(self, input_ids, attention_mask, position_ids, chunk, logits_to_keep, cache, use_cache)
        elif chunk < length:  # a whole sequence scored in position chunks, continued through a cache
            out = forward_in_chunks(self, input_ids, attention_mask, position_ids, chunk, output_trace, use_cache, layout)
        else:
            # routing without update: a forward that continues a cache holds the gates of the cache's first forward
            hold = self.router is not None and not self.router.update and cache is not None and cache.route is not None
            if use_cache and cache is None:
                cache = ComposedCache(dict(self.full_experts))
            out = self._step(input_ids, attention_mask, cache, position_ids, logits_to_keep, output_trace, hold, layout)
        if labels is not None:  # as transformers' causal LMs: position t scores labels[t + 1], -100 ignored
            if logits_to_keep:
                raise ValueError("labels: a loss needs every position's logits; pass logits_to_keep=0")
            logp = out.logits[:, :-1]  # (B, T-1, V), already normalised
            out["loss"] = torch.nn.functional.nll_loss(logp.flatten(0, 1), labels[:, 1:].flatten().to(logp.device), ignore_index=-100)
        return out

    def _step(self, input_ids, attention_mask, cache, position_ids, logits_to_keep, output_trace, hold, layout: RowLayout) -> ComposedCausalLMOutput:
        """One forward of the rows of `layout` (the base's and the LoRA experts' rows, and each full expert), then the
        composition. `cache`: continued and returned when given, else nothing is cached. `hold`: route every new
        position by the cache's routing state (the prompt's mean or maxima, left as it is) instead of the running one."""
        batch, length = input_ids.shape
        past = cache.get_seq_length() if cache is not None else 0
        if position_ids is None:
            position_ids = _positions(attention_mask, past, length, input_ids.device).expand(batch, -1)
        rows = lambda t: None if t is None else t[layout.inputs]  # noqa: E731  (B, ·) -> (N, ·)
        self._rows = layout
        with self._routed():
            out = self._hf_model(
                input_ids=rows(input_ids),
                attention_mask=rows(attention_mask),
                position_ids=rows(position_ids),
                cache=cache.rows if cache is not None else None,
                use_cache=cache is not None,
                logits_to_keep=logits_to_keep,
                output_hidden_states=self.router is not None and not hold,
            )
        if cache is not None:
            cache.layout = layout
        gates = None
        if self.router is not None:  # the base rows' hidden states: the first block
            mask = None if attention_mask is None else attention_mask[:, -length:]
            gates, state = self.router.step_gates(None if hold else last_hidden(out)[:batch], mask,
                                                  cache.route if cache is not None else None, out.logits.shape[1])  # (B, T', k)
            if cache is not None:
                cache.route = state
        full = {}
        for name, expert in self.full_experts.items():
            full[name] = expert(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                cache=cache.full[name] if cache is not None else None,
                use_cache=cache is not None,
                logits_to_keep=logits_to_keep,
            ).logits  # (B, T', V)
        first = past + length - out.logits.shape[1]  # the position of the logits' column 0
        self._check([(out.logits, layout.slots), *self._full_rows(full, batch)], first, attention_mask)
        out = self._compose(layout, out.logits[:batch], out.logits[batch:], full, output_trace, gates)
        out["cache"] = cache
        return out

    def _check(self, parts, first: int, attention_mask) -> None:
        """The logits checks of one forward (`ops.check_logits`; during `generate`, folded into its watch)."""
        if self._watch is not None:
            self._watch.add(parts, first, attention_mask)
        else:
            check_logits(self._model_names(), parts, first, attention_mask)

    def _full_rows(self, full: dict, batch: int) -> list:
        """Each full expert's logits (B, T', V) with its rows' slots (model · B + input; `layout.RowLayout.slots`)."""
        models = 1 + len(self.lora_experts)
        return [(x, torch.arange(batch, device=x.device) + (models + i) * batch) for i, x in enumerate(full.values())]

    def _compose(self, layout: RowLayout, base, rows, full: dict, output_trace, gates=None) -> ComposedCausalLMOutput:
        """The composed log-probs (B, T', V) of each group of inputs that run the same experts (`layout.groups`).

        Args:
            base: the base's logits (B, T', V); rows: the LoRA experts' rows' (n, T', V), in the layout's order;
            full: each full expert's (B, T', V); gates: (B, T', k) or None.
        """
        eos = self._eos_tensor(base.device)
        composed = None if len(layout.groups) == 1 else base.new_empty(base.shape, dtype=torch.float32)  # (B, T', V)
        for group in layout.groups:
            by_name = {self.lora_experts[j]: rows[r] for j, r in zip(group.experts, group.rows)}
            by_name.update({name: x[group.inputs] for name, x in full.items()})
            chosen = tuple(i for i, e in enumerate(self.experts) if e in by_name)
            experts = [by_name[self.experts[i]] for i in chosen]
            masks = [getattr(self, self._mask_buffers[self.experts[i]]) if self.experts[i] in self._mask_buffers else None for i in chosen]
            kept = None if gates is None else gates[group.inputs]  # (B_S, T', k)
            if kept is not None and len(chosen) < len(self.experts):
                kept = kept[..., list(chosen)]
            part = self._subset(chosen)(base[group.inputs], experts, masks, eos, kept)  # (B_S, T', V)
            if composed is None:
                composed = part
            else:
                composed[group.inputs] = part
        trace = None
        if self.composition.trace if output_trace is None else output_trace:  # (every expert computed: `_layout`)
            lb = torch.log_softmax(base.float(), -1)
            kl = torch.stack([kl_divergence(torch.log_softmax(e.float(), -1), lb) for e in experts], -1)  # (B, T, k)
            trace = CompositionTrace(list(self.experts), kl, entropy(composed), gates)
        return ComposedCausalLMOutput(logits=composed, trace=trace)

    def _subset(self, chosen: tuple[int, ...]) -> Composer:
        """The composer of these experts (indices into `experts`); the model's own for all of them."""
        if len(chosen) == len(self.experts):
            return self._composer
        if chosen not in self._subsets:
            self._subsets[chosen] = self._composer.subset(chosen)
        return self._subsets[chosen]

    def _layout(self, batch: int, cache: ComposedCache | None, keeps_cache: bool, trace: bool) -> RowLayout | None:
        """The rows a forward of `batch` inputs runs (`logitcomp.layout`); None where its routing's gates choose them
        (`logitcomp.gated`). Every expert runs for every input where an expert of weight 0 would change the composition
        (`Composer.sparse`), with a trace (it reads every expert), full-model experts, `skip_unused_experts` False,
        and, under routing, gates that follow every token over a cache, a static cache, or autograd recording."""
        if cache is not None and cache.layout is not None:
            return cache.layout  # the rows its first forward chose: fixed weights, or the gates it holds
        every = [True] * len(self.lora_experts)
        if trace or self.full_experts or not self.skip_unused_experts or not self._composer.sparse:
            return self._fixed_layout(batch, every)
        if self.router is None:
            return self._fixed_layout(batch, [w != 0 for w in self._composer.weights])
        if (self.router.update and keeps_cache) or (cache is not None and cache.is_compileable) or torch.is_grad_enabled():
            return self._fixed_layout(batch, every)
        return None

    def _fixed_layout(self, batch: int, keep: list[bool]) -> RowLayout:
        """Every input running the experts of `keep` (made once per batch size, device and set)."""
        device = self._hf_model.device
        key = (batch, tuple(keep), str(device))
        if key not in self._layouts:
            self._layouts[key] = RowLayout.of(batch, keep, device)
        return self._layouts[key]

    def _eos_ids(self) -> list[int]:
        eos = self.generation_config.eos_token_id
        eos = self.config.eos_token_id if eos is None else eos
        return [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))

    def _eos_tensor(self, device) -> torch.Tensor:
        """The EOS ids (E,) on `device`, copied there once per change of ids or device, not at every step."""
        ids = tuple(self._eos_ids())
        if self._eos[0] != ids or self._eos[1].device != torch.device(device):
            self._eos = (ids, torch.tensor(ids, dtype=torch.long, device=device))
        return self._eos[1]

    @torch.no_grad()
    def trace(self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None = None) -> CompositionTrace:
        """Expert activity and composed entropy at every position of finished sequences (e.g. `generate`'s output)."""
        return self(input_ids, attention_mask=attention_mask, use_cache=False, output_trace=True).trace

    def generate(self, *args, compile: bool | None = None, **kwargs):
        """transformers' `generate` on the composed distribution. Beam search and assisted decoding are refused.
        A model whose logits turn non-finite at a step is named when the call ends (`ops.LogitsWatch`: no step
        waits for the device to check).

        Args:
            compile: None (default) is transformers' rule: the decoding step is compiled (torch.compile, CUDA
                graphs under its default mode "reduce-overhead") on GPUs when `cache_implementation="static"`.
                True compiles it on any device, with a static cache unless another `cache_implementation` is
                given, and `compile_config`'s options; False never compiles. The first compiled call
                traces and compiles (seconds with torch's compile cache warm, over a minute cold); later
                calls of the same batch size and cache length (`max_cache_len=`) reuse the compiled step.
        """
        if compile is not None:
            kwargs = _compile_options(compile, kwargs)
        config = kwargs.get("generation_config") or self.generation_config
        if (kwargs.get("num_beams") or getattr(config, "num_beams", 1) or 1) > 1:
            raise ValueError("num_beams: beam search is not supported by composed models; use greedy or sampling")
        for key in ("assistant_model", "prompt_lookup_num_tokens"):
            if kwargs.get(key) is not None:
                raise ValueError(f"{key}: assisted decoding is not supported by composed models")
        self._watch = LogitsWatch(self._model_names())
        try:
            with self._routed():  # once for all the steps
                out = super().generate(*args, **kwargs)
            self._watch.raise_if_bad()  # the steps' logits checks, read once
            return out
        finally:
            self._watch = None

    def _model_names(self) -> list[str]:
        """The composed models as errors name them, in the order of the logits checks' slots: the base, the LoRA
        experts, the full-model experts."""
        return ["the base", *(f"expert {e!r}" for e in [*self.lora_experts, *self.full_experts])]

    @contextmanager
    def _routed(self):
        """Grouped-LoRA routing of the 1 + m row blocks (and the decoding layout of the head), over stacked factors
        checked against the live adapters once, on entry: around one forward, one `generate` call or one chunked
        scoring (their forwards cannot change the weights). Inside an outer one, it adds nothing."""
        if self._routing:
            yield
            return
        with self._lora.frozen() if self._lora else nullcontext(), grouped_lora(self._lora.layers() if self._lora else [], lambda: self._rows), \
                fast_head(self._hf_model):
            self._routing = True
            try:
                yield
            finally:
                self._routing = False

    # ---- persistence (logitcomp/persistence.py) -----------------------------------------------
    def save_pretrained(self, save_directory, **kwargs) -> Path:
        """Write the composition folder: `composition.json`, the LoRA adapters, and what makes it a transformers
        model folder (config.json, the base's tokenizer, the generation config). transformers' keywords
        (`is_main_process`, `max_shard_size`, `push_to_hub` with `repo_id`, ...) as `persistence.save_pretrained` says."""
        return persistence.save_pretrained(self, save_directory, **kwargs)

    def push_to_hub(self, repo_id: str, **kwargs) -> str:
        """Upload the composition folder to the hub repo `repo_id` (`persistence.push_to_hub`)."""
        return persistence.push_to_hub(self, repo_id, **kwargs)

    @classmethod
    def from_pretrained(cls, directory, **kwargs) -> ComposedModelForCausalLM:
        """Restore a composition written by `save_pretrained`, directly or through `AutoModelForCausalLM`, with
        `from_experts`' loading keywords (`dtype`, `device`, `device_map`, ...; `persistence.from_pretrained`)."""
        return persistence.from_pretrained(cls, directory, **kwargs)

    @classmethod
    def from_experts(cls, base_path, experts: dict, weights: dict | None = None, *, config: CompositionConfig | None = None,
                     dtype=None, device=None, allow_pickle: bool = False, trust_remote_code: bool = False,
                     torch_dtype=None, device_map=None) -> ComposedModelForCausalLM:
        """Load a base folder and expert folders (LoRA adapters or full models) and compose them.

        Args:
            base_path: the base model folder.
            experts: expert name -> folder.
            weights: expert name -> weight (overrides `config.weights`); default 1.0.
            config: every other composition option.
            allow_pickle / trust_remote_code: opt-ins for `.bin` weights and custom model code.
            device_map: accelerate's placement of a base larger than one device (`"auto"`, or a dict of
                module -> device), as in transformers; each LoRA expert's rows run on the device of
                the layer they update. Full-model experts are placed the same way.
        """
        options = LoadOptions.of(dtype=dtype, device=device, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code,
                                 torch_dtype=torch_dtype, device_map=device_map)
        return persistence.from_experts(cls, base_path, experts, weights, config, options)


def _compile_options(compile: bool, kwargs: dict) -> dict:
    """`generate`'s keyword arguments for compile=True/False, in transformers' own terms: a static cache and a
    `CompileConfig` (whose private `_compile_all_devices` is transformers' switch for compiling off GPUs), or
    `disable_compile`."""
    if not compile:
        return {**kwargs, "disable_compile": True}
    config = copy.deepcopy(kwargs.get("compile_config") or CompileConfig())
    config._compile_all_devices = True
    return {"cache_implementation": "static", **kwargs, "compile_config": config}


def compose(peft_model, experts: dict[str, float] | list[str], config: CompositionConfig | None = None) -> ComposedModelForCausalLM:
    """Compose adapters that a peft model already holds.

    Args:
        peft_model: a `PeftModel` holding the adapters (not merged).
        experts: adapter name -> weight (or a list of names, weight 1.0 each).
        config: other composition options; `experts`' weights override its `weights`.
    """
    names = list(experts)
    weights = dict(experts) if isinstance(experts, dict) else {}
    config = (config or CompositionConfig()).with_weights(weights)
    return ComposedModelForCausalLM(peft_model, names, {}, config)
