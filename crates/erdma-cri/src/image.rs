//! `ImageService.ImageStatus`: whether an image is in the runtime's store, with its ID, digests
//! and user. The kubelet asks this before every container it creates (to decide on a pull by the
//! pod's `imagePullPolicy`, and for the image's user); the lab's kubelet does the same and never
//! pulls.

use crate::lifecycle::timed;
use crate::runtime::v1 as cri;
use crate::{CALL_TIMEOUT, CriClient, CriError};
use std::collections::BTreeMap;

impl CriClient {
    /// `ImageStatus` of `image` (a reference or an image ID): `None` when the runtime does not
    /// have it (the runtime answers without an image, as CRI specifies).
    pub async fn image_status(&mut self, image: &str) -> Result<Option<cri::Image>, CriError> {
        let fut = self.images.image_status(cri::ImageStatusRequest {
            image: Some(cri::ImageSpec {
                image: image.to_string(),
                annotations: BTreeMap::new(),
                user_specified_image: String::new(),
            }),
            verbose: false,
        });
        let r = timed(&self.socket, "ImageStatus", CALL_TIMEOUT, fut).await?;
        Ok(r.image)
    }
}
