//! The site's configuration store, in the anchor's layout (its configuration service, whose
//! YAML-file backend reads this same shape): one YAML document under `o2/`.
//!
//! - `o2/runtime/aliecs/defaults`, `o2/runtime/aliecs/vars`: site variables;
//! - `o2/hardware/detectors/<DET>/flps/<host>`, `o2/hardware/flps/<host>/cards`: the inventory
//!   behind `inventory.*`;
//! - `o2/components/<component>/<run type>/<role>/<entry>`: what `config.Resolve` looks up;
//! - `o2/runtime/<component>/<key>`: what `runtime.Get` reads.
//!
//! Pure data: the backends (a file, a ConfigMap) only hand over the text.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use super::error::{Error, Loc, Result};
use super::load::{read_yaml, var_block};
use super::model::VarBlock;
use super::yaml::{self, Kind, Node};

/// A parsed configuration store. Cheap to share; never changed once built.
#[derive(Clone, Debug)]
pub struct ConfigStore {
    root: Node,
    /// Site `defaults` and `vars` (`o2/runtime/aliecs/...`), checked when the store is read.
    defaults: VarBlock,
    vars: VarBlock,
}

impl ConfigStore {
    /// Reads a store file; errors name the file, line and column.
    pub fn load(path: &Path) -> Result<Self> {
        Self::from_node(read_yaml(path)?)
    }

    /// Parses a store's text; `name` is what error messages call it (a file, `ns/cm:key`).
    pub fn parse(name: &str, text: &str) -> Result<Self> {
        let file: Arc<str> = Arc::from(name);
        Self::from_node(yaml::parse(&file, text)?)
    }

    /// An empty store (no site variables, no inventory).
    pub fn empty() -> Self {
        let file: Arc<str> = Arc::from("<no configuration store>");
        ConfigStore {
            root: Node {
                loc: Loc::file_start(&file),
                tag: None,
                single_line: true,
                quoted: false,
                kind: Kind::Map(Vec::new()),
            },
            defaults: VarBlock::default(),
            vars: VarBlock::default(),
        }
    }

    fn from_node(root: Node) -> Result<Self> {
        match &root.kind {
            Kind::Map(_) => {}
            Kind::Null => {}
            _ => {
                return Err(Error::new(
                    &root.loc,
                    format!(
                        "not a configuration store: expected a mapping with `o2:`, found {}",
                        root.kind_name()
                    ),
                ));
            }
        }
        if let Some(o2) = root.get("o2")
            && !matches!(o2.kind, Kind::Map(_) | Kind::Null)
        {
            return Err(Error::new(
                &o2.loc,
                format!("`o2` must be a mapping, found {}", o2.kind_name()),
            ));
        }
        let mut store = ConfigStore {
            root,
            defaults: VarBlock::default(),
            vars: VarBlock::default(),
        };
        let defaults = store
            .node(&["o2", "runtime", "aliecs", "defaults"])
            .cloned();
        let vars = store.node(&["o2", "runtime", "aliecs", "vars"]).cloned();
        store.defaults = site_block(defaults.as_ref())?;
        store.vars = site_block(vars.as_ref())?;
        // The inventory's shape is checked once, so that lookups cannot meet a bad node later.
        if let Some(dets) = store.node(&["o2", "hardware", "detectors"]) {
            for (det, body) in entries(dets, "detectors")? {
                if let Some(flps) = body.get("flps") {
                    entries(flps, &format!("flps of detector {det}"))?;
                }
            }
        }
        Ok(store)
    }

    /// Where the store came from (for messages).
    pub fn name(&self) -> &str {
        &self.root.loc.file
    }

    /// Site defaults (`o2/runtime/aliecs/defaults`).
    pub fn defaults(&self) -> &VarBlock {
        &self.defaults
    }

    /// Site vars (`o2/runtime/aliecs/vars`).
    pub fn vars(&self) -> &VarBlock {
        &self.vars
    }

    /// The node at a key path, if any.
    fn node(&self, path: &[&str]) -> Option<&Node> {
        let mut at = &self.root;
        for k in path {
            at = at.get(k)?;
        }
        Some(at)
    }

    /// The node at a `/`-separated key (`o2/components/readout`), if any.
    pub fn get(&self, key: &str) -> Option<&Node> {
        let parts: Vec<&str> = key.split('/').filter(|p| !p.is_empty()).collect();
        self.node(&parts)
    }

    /// The detector whose inventory lists `host` (`o2/hardware/detectors/<DET>/flps/<host>`);
    /// detectors are tried in name order.
    pub fn detector_for_host(&self, host: &str) -> std::result::Result<String, String> {
        let Some(dets) = self.node(&["o2", "hardware", "detectors"]) else {
            return Err(format!(
                "no detector inventory (o2/hardware/detectors) in {}",
                self.name()
            ));
        };
        let mut dets = entries(dets, "detectors").map_err(|e| e.to_string())?;
        dets.sort_by_key(|(d, _)| *d);
        for (det, body) in dets {
            if let Some(flps) = body.get("flps")
                && let Ok(hosts) = entries(flps, "flps")
                && hosts.iter().any(|(h, _)| *h == host)
            {
                return Ok(det.to_string());
            }
        }
        Err(format!(
            "host `{host}` is in no detector's inventory (o2/hardware/detectors/*/flps) of {}",
            self.name()
        ))
    }

    /// The detector inventory: every detector under `o2/hardware/detectors`, by name, with
    /// the hosts its `flps` list (empty without an inventory). Its shape was checked at load.
    pub fn inventory(&self) -> BTreeMap<String, Vec<String>> {
        let Some(dets) = self.node(&["o2", "hardware", "detectors"]) else {
            return BTreeMap::new();
        };
        let dets = entries(dets, "detectors").unwrap_or_default();
        dets.into_iter()
            .map(|(det, body)| {
                let hosts = body
                    .get("flps")
                    .and_then(|f| entries(f, "flps").ok())
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(h, _)| h.to_string())
                    .collect();
                (det.to_string(), hosts)
            })
            .collect()
    }

    /// The detectors of several hosts: each host's, deduplicated, sorted.
    pub fn detectors_for_hosts(
        &self,
        hosts: &[String],
    ) -> std::result::Result<Vec<String>, String> {
        let mut out = BTreeSet::new();
        for h in hosts {
            out.insert(self.detector_for_host(h)?);
        }
        Ok(out.into_iter().collect())
    }

    /// The CRU cards of a host: `o2/hardware/flps/<host>/cards`, a JSON object of cards
    /// (`{"0": {"serial": "1041", "endpoint": "0", ...}}`); their serials, each once, in the
    /// order of the card keys (the anchor walks a Go map: its order is random).
    pub fn cru_cards_for_host(&self, host: &str) -> std::result::Result<Vec<String>, String> {
        let mut serials: Vec<String> = Vec::new();
        for (_, serial, _) in self.cards(host)? {
            if !serials.contains(&serial) {
                serials.push(serial);
            }
        }
        Ok(serials)
    }

    /// The endpoints of the cards of a host with one serial, in card key order.
    pub fn endpoints_for_cru_card(
        &self,
        host: &str,
        serial: &str,
    ) -> std::result::Result<Vec<String>, String> {
        Ok(self
            .cards(host)?
            .into_iter()
            .filter(|(_, s, _)| s == serial)
            .map(|(_, _, e)| e)
            .collect())
    }

    /// (card key, serial, endpoint) of every card of a host, sorted by key.
    fn cards(&self, host: &str) -> std::result::Result<Vec<(String, String, String)>, String> {
        let node = self
            .node(&["o2", "hardware", "flps", host, "cards"])
            .ok_or_else(|| {
                format!(
                    "no cards for host `{host}` (o2/hardware/flps/{host}/cards) in {}",
                    self.name()
                )
            })?;
        let text = node.as_str().unwrap_or("");
        let bad = |e: String| format!("o2/hardware/flps/{host}/cards at {}: {e}", node.loc);
        let v: serde_json::Value = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        let serde_json::Value::Object(m) = v else {
            return Err(bad("expected a JSON object of cards".to_string()));
        };
        let field = |card: &serde_json::Value, k: &str| -> std::result::Result<String, String> {
            match card.get(k) {
                None | Some(serde_json::Value::Null) => Ok(String::new()),
                Some(serde_json::Value::String(s)) => Ok(s.clone()),
                Some(_) => Err(bad(format!("`{k}` of a card must be a string"))),
            }
        };
        let mut out = Vec::new();
        for (key, card) in &m {
            out.push((
                key.clone(),
                field(card, "serial")?,
                field(card, "endpoint")?,
            ));
        }
        out.sort();
        Ok(out)
    }

    /// `config.Resolve`: the most specific existing entry under `o2/components/<component>/`,
    /// trying the run type then `ANY`, the role then `any`; returns its key path
    /// `<component>/<run type>/<role>/<entry>`.
    pub fn resolve(
        &self,
        component: &str,
        run_type: &str,
        role: &str,
        entry: &str,
    ) -> std::result::Result<String, String> {
        // The anchor's order: as asked, run type ANY, role `any`, then both.
        for (rt, r) in [
            (run_type, role),
            ("ANY", role),
            (run_type, "any"),
            ("ANY", "any"),
        ] {
            if self
                .node(&["o2", "components", component, rt, r, entry])
                .is_some()
            {
                return Ok(format!("{component}/{rt}/{r}/{entry}"));
            }
        }
        Err(format!(
            "no configuration entry {component}/{{{run_type},ANY}}/{{{role},any}}/{entry} under o2/components in {}",
            self.name()
        ))
    }

    /// `runtime.Get(component, key)`: `o2/runtime/<component>/<key>` as text.
    pub fn runtime_get(&self, component: &str, key: &str) -> std::result::Result<String, String> {
        let mut path = vec!["o2", "runtime"];
        path.extend(component.split('/').filter(|p| !p.is_empty()));
        path.extend(key.split('/').filter(|p| !p.is_empty()));
        match self.node(&path) {
            Some(n) => Ok(n.as_str().unwrap_or_default().to_string()),
            None => Err(format!(
                "no runtime entry {} in {}",
                path.join("/"),
                self.name()
            )),
        }
    }

    /// The entries under `o2/runtime/<component>`: the `/`-separated path of every value
    /// below it (not of the mappings on the way), by name; None when the store has no such
    /// component.
    pub fn runtime_keys(&self, component: &str) -> Option<Vec<String>> {
        let mut path = vec!["o2", "runtime"];
        path.extend(component.split('/').filter(|p| !p.is_empty()));
        let mut keys = Vec::new();
        // The store is a parsed file: finite, and no deeper than its YAML's nesting.
        let mut stack = vec![(String::new(), self.node(&path)?)];
        while let Some((prefix, node)) = stack.pop() {
            for (k, v) in entries(node, "runtime").unwrap_or_default() {
                let at = if prefix.is_empty() {
                    k.to_string()
                } else {
                    format!("{prefix}/{k}")
                };
                match v.kind {
                    Kind::Map(_) => stack.push((at, v)),
                    _ => keys.push(at),
                }
            }
        }
        keys.sort();
        Some(keys)
    }
}

/// A site `defaults`/`vars` block: a mapping of strings (absent or empty: none).
fn site_block(node: Option<&Node>) -> Result<VarBlock> {
    match node {
        None => Ok(VarBlock::default()),
        Some(n) => var_block(Some(&n)),
    }
}

/// The (key, value) pairs of a mapping node; `what` names it in the error.
fn entries<'n>(node: &'n Node, what: &str) -> Result<Vec<(&'n str, &'n Node)>> {
    match &node.kind {
        Kind::Null => Ok(Vec::new()),
        Kind::Map(m) => m
            .iter()
            .map(|(k, v)| match k.as_str() {
                Some(s) => Ok((s, v)),
                None => Err(Error::new(&k.loc, format!("{what}: keys must be names"))),
            })
            .collect(),
        _ => Err(Error::new(
            &node.loc,
            format!("{what}: expected a mapping, found {}", node.kind_name()),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STORE: &str = r#"
o2:
  components:
    readout:
      ANY:
        any:
          readout-stfb-flp001: "x"
      PHYSICS:
        stfb:
          readout-stfb-flp002: "y"
  hardware:
    detectors:
      TST:
        flps:
          flp001:
            cards: '{}'
      ITS:
        flps:
          flp002: {}
    flps:
      flp001:
        cards: '{"0": {"serial": "1041", "endpoint": "0"}, "1": {"serial": "1041", "endpoint": "1"}, "2": {"serial": "0228", "endpoint": "0"}}'
  runtime:
    aliecs:
      defaults:
        detector: TST
        hosts: '["flp001"]'
      vars: {}
    trg:
      ctp: "load-params"
"#;

    fn store() -> ConfigStore {
        ConfigStore::parse("store.yaml", STORE).unwrap()
    }

    #[test]
    fn site_variables_and_inventory() {
        let s = store();
        assert_eq!(
            s.defaults().get("detector").unwrap().as_literal(),
            Some("TST")
        );
        assert!(s.vars().is_empty());
        assert_eq!(s.detector_for_host("flp002").unwrap(), "ITS");
        assert!(
            s.detector_for_host("flp009")
                .unwrap_err()
                .contains("flp009")
        );
        assert_eq!(
            s.detectors_for_hosts(&["flp002".into(), "flp001".into()])
                .unwrap(),
            vec!["ITS", "TST"]
        );
        assert_eq!(
            s.cru_cards_for_host("flp001").unwrap(),
            vec!["1041", "0228"]
        );
        assert_eq!(
            s.endpoints_for_cru_card("flp001", "1041").unwrap(),
            vec!["0", "1"]
        );
        assert!(s.cru_cards_for_host("flp002").is_err());
        let inv = s.inventory();
        assert_eq!(inv.keys().collect::<Vec<_>>(), ["ITS", "TST"]);
        assert_eq!(inv["ITS"], ["flp002"]);
        assert!(ConfigStore::empty().inventory().is_empty());
    }

    #[test]
    fn runtime_keys_are_the_paths_of_values() {
        let s = store();
        assert_eq!(s.runtime_keys("trg"), Some(vec!["ctp".to_string()]));
        assert_eq!(
            s.runtime_keys("aliecs"),
            Some(vec![
                "defaults/detector".to_string(),
                "defaults/hosts".to_string()
            ])
        );
        assert_eq!(s.runtime_keys("nothing"), None);
    }

    #[test]
    fn resolve_tries_run_type_then_any_and_role_then_any() {
        let s = store();
        assert_eq!(
            s.resolve("readout", "PHYSICS", "stfb", "readout-stfb-flp002")
                .unwrap(),
            "readout/PHYSICS/stfb/readout-stfb-flp002"
        );
        assert_eq!(
            s.resolve("readout", "PHYSICS", "stfb", "readout-stfb-flp001")
                .unwrap(),
            "readout/ANY/any/readout-stfb-flp001"
        );
        assert!(s.resolve("readout", "PHYSICS", "stfb", "nope").is_err());
        assert_eq!(s.runtime_get("trg", "ctp").unwrap(), "load-params");
    }

    #[test]
    fn malformed_stores_name_the_place() {
        let e = ConfigStore::parse("s.yaml", "o2: [1, 2]\n").unwrap_err();
        assert!(e.to_string().starts_with("s.yaml:1:"), "{e}");
        let e = ConfigStore::parse(
            "s.yaml",
            "o2:\n  runtime:\n    aliecs:\n      defaults: [a]\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("s.yaml:4:"), "{e}");
        let e = ConfigStore::parse("s.yaml", "o2: {a: [}\n").unwrap_err();
        assert!(e.to_string().contains("s.yaml:1:"), "{e}");
    }
}
