//! The cluster and node a data directory belongs to, written on its first start in cluster mode
//! and checked on every later one: a node started on another node's data, or on a directory of
//! another cluster, is refused before it talks to any peer.

use std::io::Write;
use std::path::Path;

use super::ClusterSettings;

const FILE: &str = "identity";

/// Checks that `dir` belongs to this node of this cluster, or makes it so if it is new.
pub(super) fn claim(dir: &Path, settings: &ClusterSettings) -> Result<(), String> {
    let path = dir.join(FILE);
    let mine = format!(
        "cluster_id = {:?}\nnode_id = {}\n",
        settings.cluster_id, settings.node_id
    );
    match std::fs::read_to_string(&path) {
        Ok(found) if found == mine => Ok(()),
        Ok(found) => Err(format!(
            "{} belongs to another node or cluster ({}), not to node {} of cluster {:?}: \
             start this node on its own data directory",
            path.display(),
            found.trim().replace('\n', ", "),
            settings.node_id,
            settings.cluster_id
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
            let mut file = std::fs::File::create(&path)
                .map_err(|e| format!("creating {}: {e}", path.display()))?;
            file.write_all(mine.as_bytes())
                .and_then(|()| file.sync_all())
                .map_err(|e| format!("writing {}: {e}", path.display()))
        }
        Err(e) => Err(format!("reading {}: {e}", path.display())),
    }
}
