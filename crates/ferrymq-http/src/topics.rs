//! Routes: see the crate documentation.

use utoipa_axum::router::OpenApiRouter;

use crate::AppState;

pub(crate) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
}
