//! `apricot.Apricot` (proto/apricot.proto) on the o2control listener: the configuration
//! store's detector inventory and runtime entries, read only, as the ControlGUI asks for them
//! beside o2control. Every method is a read (viewer role); the store is the daemon's, the
//! one its renders read.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::detectors::Inventory;
use super::pb::apricot as pb;
use crate::bridge::Bridge;
use crate::workflow::store::ConfigStore;

/// The detector the anchor keeps out of ListDetectors unless `getAll`.
const PRIVATE_DETECTOR: &str = "TRG";

/// Every caller the listener identifies (a viewer or more) may read.
pub struct Apricot {
    bridge: Arc<Bridge>,
}

impl Apricot {
    pub fn new(bridge: Arc<Bridge>) -> Self {
        Apricot { bridge }
    }

    fn store(&self, rpc: &str) -> Result<Arc<ConfigStore>, Status> {
        self.bridge
            .store()
            .map_err(|e| Status::unavailable(format!("{rpc}: configuration store: {e}")))
    }

    fn inventory(&self, rpc: &str) -> Result<Inventory, Status> {
        Ok(Inventory::new(self.store(rpc)?.inventory()))
    }
}

/// A host's detector, NOT_FOUND in the anchor's words when no detector lists it.
fn detector_of(inv: &Inventory, host: &str) -> Result<String, Status> {
    inv.detector_of(host)
        .map(str::to_string)
        .ok_or_else(|| Status::not_found(format!("detector not found for host {host}")))
}

#[tonic::async_trait]
impl pb::apricot_server::Apricot for Apricot {
    async fn list_detectors(
        &self,
        req: Request<pb::DetectorsRequest>,
    ) -> Result<Response<pb::DetectorsResponse>, Status> {
        let all = req.get_ref().get_all;
        let detectors = self
            .inventory("ListDetectors")?
            .all()
            .iter()
            .filter(|d| all || *d != PRIVATE_DETECTOR)
            .cloned()
            .collect();
        Ok(Response::new(pb::DetectorsResponse { detectors }))
    }

    async fn get_host_inventory(
        &self,
        req: Request<pb::HostGetRequest>,
    ) -> Result<Response<pb::HostEntriesResponse>, Status> {
        let inv = self.inventory("GetHostInventory")?;
        let det = &req.get_ref().detector;
        // As the anchor: an unknown detector has no hosts; none named is every host.
        let hosts = if det.is_empty() {
            inv.hosts()
        } else {
            inv.hosts_of(det)
                .map(<[String]>::to_vec)
                .unwrap_or_default()
        };
        Ok(Response::new(pb::HostEntriesResponse { hosts }))
    }

    async fn get_detectors_inventory(
        &self,
        _: Request<pb::Empty>,
    ) -> Result<Response<pb::DetectorEntriesResponse>, Status> {
        let inv = self.inventory("GetDetectorsInventory")?;
        let detector_entries = inv
            .all()
            .iter()
            .map(|d| {
                let flps = inv.hosts_of(d).map(<[String]>::to_vec).unwrap_or_default();
                (d.clone(), pb::DetectorInventoryResponse { flps })
            })
            .collect();
        Ok(Response::new(pb::DetectorEntriesResponse {
            detector_entries,
        }))
    }

    async fn get_detector_for_host(
        &self,
        req: Request<pb::HostRequest>,
    ) -> Result<Response<pb::DetectorResponse>, Status> {
        let inv = self.inventory("GetDetectorForHost")?;
        let payload = detector_of(&inv, &req.get_ref().hostname)?;
        Ok(Response::new(pb::DetectorResponse { payload }))
    }

    async fn get_detectors_for_hosts(
        &self,
        req: Request<pb::HostsRequest>,
    ) -> Result<Response<pb::DetectorsResponse>, Status> {
        let inv = self.inventory("GetDetectorsForHosts")?;
        // Every host must have one, as in the anchor.
        for h in &req.get_ref().hosts {
            detector_of(&inv, h)?;
        }
        let detectors = inv.detectors_of(req.get_ref().hosts.iter().map(String::as_str));
        Ok(Response::new(pb::DetectorsResponse { detectors }))
    }

    async fn get_runtime_entry(
        &self,
        req: Request<pb::GetRuntimeEntryRequest>,
    ) -> Result<Response<pb::ComponentResponse>, Status> {
        let r = req.get_ref();
        let store = self.store("GetRuntimeEntry")?;
        match store.runtime_get(&r.component, &r.key) {
            Ok(payload) => Ok(Response::new(pb::ComponentResponse { payload })),
            Err(e) => Err(Status::not_found(format!("GetRuntimeEntry: {e}"))),
        }
    }

    async fn list_runtime_entries(
        &self,
        req: Request<pb::ListRuntimeEntriesRequest>,
    ) -> Result<Response<pb::ComponentEntriesResponse>, Status> {
        let component = &req.get_ref().component;
        let store = self.store("ListRuntimeEntries")?;
        match store.runtime_keys(component) {
            Some(payload) => Ok(Response::new(pb::ComponentEntriesResponse { payload })),
            None => Err(Status::not_found(format!(
                "ListRuntimeEntries: no runtime component o2/runtime/{component} in {}",
                store.name()
            ))),
        }
    }
}
