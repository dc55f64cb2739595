package diloco

// Encoder exposes the compressor to the external tests, which replay streaming DiLoCo serially.
type Encoder struct{ z compressor }

// NewEncoder returns an encoder of c.
func NewEncoder(c Compression) *Encoder { return &Encoder{z: compressor{c: c}} }

// Encode writes the encoding of g to dst.
func (e *Encoder) Encode(dst []byte, g []float32) { e.z.encode(dst, g) }

// Feedback sets err to what the last Encode of g did not deliver.
func (e *Encoder) Feedback(err, g []float32) { e.z.feedback(err, g) }
