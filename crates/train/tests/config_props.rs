//! Validation is total: any TOML value in any config field gives a config or a one-line
//! error naming the field, never a panic (property test), and a valid config can build its
//! model description and mesh.

use proptest::prelude::*;
use train::config::TrainConfig;

/// Every field a user can set, as `table.key` (top-level keys have no table).
const FIELDS: [&str; 43] = [
    "seed",
    "steps",
    "log_every",
    "eval_every",
    "checkpoint_every",
    "nonfinite_limit",
    "mesh.data",
    "mesh.expert",
    "data.max_langs",
    "data.temperature",
    "data.max_len",
    "data.batch_size",
    "data.dev_size",
    "data.vocab_size",
    "data.tokenizer_pairs_per_lang",
    "data.min_english_words",
    "model.model_dim",
    "model.heads",
    "model.head_dim",
    "model.ffn_dim",
    "model.enc_layers",
    "model.dec_layers",
    "model.moe_every",
    "model.experts",
    "model.expert_dim",
    "model.group_size",
    "model.capacity_factor",
    "model.second_expert",
    "model.threshold",
    "model.aux_loss_coef",
    "model.activation",
    "model.dropout",
    "model.label_smoothing",
    "model.remat",
    "model.precision",
    "eval.beam",
    "eval.length_penalty",
    "optimizer.kind",
    "optimizer.beta1",
    "optimizer.lr.kind",
    "optimizer.lr.base",
    "optimizer.lr.warmup_steps",
    "optimizer.lr.cooldown",
];

/// A TOML value of any kind a user might write, the awkward ones included.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<i64>().prop_map(|v| v.to_string()),
        (0u64..64).prop_map(|v| v.to_string()),
        any::<f64>().prop_map(|v| format!("{v:?}")),
        Just("nan".to_string()),
        Just("inf".to_string()),
        Just("-inf".to_string()),
        Just("0".to_string()),
        Just("-1".to_string()),
        Just("1e300".to_string()),
        "[a-z_-]{0,12}".prop_map(|s| format!("{s:?}")),
        Just("true".to_string()),
        Just("[1, 2]".to_string()),
    ]
}

fn toml_of(settings: &[(usize, String)]) -> String {
    let mut top = String::new();
    let mut tables: Vec<(String, String)> = Vec::new();
    for (i, v) in settings {
        let field = FIELDS[*i];
        match field.rsplit_once('.') {
            None => top.push_str(&format!("{field} = {v}\n")),
            Some((table, key)) => match tables.iter_mut().find(|(t, _)| t == table) {
                Some((_, body)) => body.push_str(&format!("{key} = {v}\n")),
                None => tables.push((table.to_string(), format!("{key} = {v}\n"))),
            },
        }
    }
    for (t, body) in tables {
        top.push_str(&format!("[{t}]\n{body}"));
    }
    top
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn any_values_give_a_config_or_a_one_line_error(
        settings in prop::collection::vec((0..FIELDS.len(), value()), 1..6)
    ) {
        let text = toml_of(&settings);
        match TrainConfig::from_toml(&text, "c.toml") {
            Ok(cfg) => {
                // A valid config is usable: its mesh, model and warnings.
                prop_assert!(cfg.mesh().is_ok(), "{text}");
                prop_assert!(cfg.transformer(1000).is_ok(), "{text}");
                let _ = cfg.warnings();
            }
            Err(e) => {
                let msg = e.to_string();
                prop_assert!(!msg.contains('\n'), "{msg}");
                prop_assert!(msg.starts_with("config"), "{msg}");
            }
        }
    }
}

/// A run directory's config.toml written before `lr.cooldown` existed keeps its schedule
/// when read as the run's own (no cool-down), while a user's partial config takes the main
/// job's.
#[test]
fn a_runs_own_config_keeps_its_schedule() {
    let written = TrainConfig::default().to_toml();
    let old: String = written
        .lines()
        .filter(|l| !l.starts_with("cooldown"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_ne!(old, written, "the main job's config names lr.cooldown");
    let own = TrainConfig::from_run_toml(&old, "run/config.toml").unwrap();
    let user = TrainConfig::from_toml(&old, "user.toml").unwrap();
    let cooldown = |c: &TrainConfig| match c.optimizer.lr() {
        train::optim::LrSchedule::Rsqrt { cooldown, .. } => *cooldown,
        other => panic!("{other:?}"),
    };
    assert_eq!(cooldown(&own), 0.0);
    assert_eq!(cooldown(&user), 0.3);
    assert_eq!(
        TrainConfig::from_run_toml(&written, "c").unwrap(),
        TrainConfig::default()
    );
}
