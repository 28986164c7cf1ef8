/* fuzz_model_config.c: libFuzzer target for config.json and the
 * quantisation config (model_config_parse, model_quant_parse).
 *
 * The same text goes to both parsers, so config.json seeds explore the model
 * fields and quantization_config, and hf_quant_config.json seeds explore
 * ModelOpt's record.  A parsed config must satisfy the invariants the
 * forward pass relies on (positive sizes, a full first indexer layer, eos ids
 * inside the vocabulary); a refusal must be one MJ_EINPUT line.  Seeds:
 * tests/fuzz/config/. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

static void check_refusal(const mj_err *err) {
  if (err->code != MJ_EINPUT || !err->msg[0] || strchr(err->msg, '\n')) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > (1 << 16)) return 0;
  mj_arena a;
  mj_arena_init(&a, 1 << 16);
  model_config c;
  mj_err err = {0};
  if (model_config_parse(&a, (const char *)data, size, "config.json", &c, &err) == 0) {
    if (c.hidden_size <= 0 || c.num_hidden_layers <= 0 || c.vocab_size <= 0 || c.n_group <= 0 ||
        c.n_routed_experts % c.n_group || c.num_experts_per_tok > c.n_routed_experts ||
        !c.layer_indexer_full[0])
      abort();
    for (int i = 0; i < c.n_eos; i++)
      if (c.eos_token_id[i] < 0 || c.eos_token_id[i] >= c.vocab_size) abort();
    (void)model_quant_excluded(&c, "model.layers.1.mlp.experts.7.gate_proj");
  } else {
    check_refusal(&err);
  }
  mj_err_clear(&err);
  memset(&c, 0, sizeof c);
  if (model_quant_parse(&a, (const char *)data, size, "hf_quant_config.json", &c, &err) == 0)
    (void)model_quant_excluded(&c, "lm_head");
  else
    check_refusal(&err);
  mj_err_clear(&err);
  mj_arena_free(&a);
  return 0;
}
