//! The in-memory form of a labelled image data set.

/// Images in [0, 1], N×C×H×W row-major, with one label per image.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageSet {
    /// Short name used in reports, e.g. `mnist/test`.
    pub name: String,
    /// All pixels in [0, 1]: N·C·H·W values, image after image, each C×H×W row-major.
    pub images: Vec<f32>,
    /// The class of each image, an index into `class_names`.
    pub labels: Vec<u8>,
    /// C: 1 for (Fashion-)MNIST, 3 (RGB) for CIFAR.
    pub channels: usize,
    /// H, in pixels.
    pub height: usize,
    /// W, in pixels.
    pub width: usize,
    /// The name of each class, by label.
    pub class_names: Vec<String>,
}

impl ImageSet {
    /// Number of images (N).
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether the set holds no image.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Number of values in one image (C·H·W).
    pub fn image_len(&self) -> usize {
        self.channels * self.height * self.width
    }

    /// Number of classes (the length of `class_names`).
    pub fn num_classes(&self) -> usize {
        self.class_names.len()
    }

    /// The pixels of image `i`.
    pub fn image(&self, i: usize) -> &[f32] {
        let d = self.image_len();
        &self.images[i * d..(i + 1) * d]
    }

    /// A new set holding the images at `indices`, in that order.
    pub fn select(&self, indices: &[usize]) -> ImageSet {
        let mut images = Vec::with_capacity(indices.len() * self.image_len());
        let mut labels = Vec::with_capacity(indices.len());
        for &i in indices {
            images.extend_from_slice(self.image(i));
            labels.push(self.labels[i]);
        }
        ImageSet {
            name: self.name.clone(),
            images,
            labels,
            channels: self.channels,
            height: self.height,
            width: self.width,
            class_names: self.class_names.clone(),
        }
    }

    /// Splits off the last `n` images (e.g. a validation set) and returns `(first, last)`.
    pub fn split_last(&self, n: usize) -> (ImageSet, ImageSet) {
        let cut = self.len().saturating_sub(n);
        let head: Vec<usize> = (0..cut).collect();
        let tail: Vec<usize> = (cut..self.len()).collect();
        let mut a = self.select(&head);
        let mut b = self.select(&tail);
        a.name = format!("{}[..{cut}]", self.name);
        b.name = format!("{}[{cut}..]", self.name);
        (a, b)
    }
}
