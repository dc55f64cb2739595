package diloco

import "fmt"

// Hidden is the width of the MLP's hidden layer.
const Hidden = 256

// Layout of the parameter vector (and of every gradient vector): the
// offsets of the four tensors in one contiguous []float32. W1 is stored
// row-major as Hidden×InputSize (one row per hidden unit), then b1 (Hidden
// values), W2 row-major as NumClasses×Hidden, then b2 (NumClasses values).
const (
	OffW1     = 0
	OffB1     = OffW1 + Hidden*InputSize
	OffW2     = OffB1 + Hidden
	OffB2     = OffW2 + NumClasses*Hidden
	NumParams = OffB2 + NumClasses
)

// MLP is the 784-256-10 perceptron with a ReLU hidden layer and a softmax
// cross-entropy loss. Its parameters are one contiguous vector, so that a
// trainer can all-reduce, hash or replace them as a single tensor.
//
// An MLP is not safe for concurrent use: Forward and Backward share scratch
// buffers. Use one MLP per goroutine; they may share nothing but read-only
// Datasets.
type MLP struct {
	// Params holds the NumParams parameters in the layout given by the Off*
	// constants. The caller may read, overwrite or replace it (with a slice
	// of length NumParams) between calls.
	Params []float32

	x  []float32 // input of the last Forward, owned by the caller
	n  int       // batch size of the last Forward
	h  []float32 // n x Hidden activations after ReLU
	z  []float32 // n x NumClasses logits
	dz []float32 // n x NumClasses loss gradient with respect to z
	dh []float32 // n x Hidden loss gradient with respect to the hidden pre-activations
	nz []int     // scratch: samples with a non-zero dh for one hidden unit
}

// NewMLP returns an MLP whose parameters are initialised from seed, as by
// InitParams.
func NewMLP(seed uint64) *MLP {
	m := &MLP{Params: make([]float32, NumParams)}
	InitParams(m.Params, seed)
	return m
}

// InitParams fills params, which must have length NumParams, with the initial
// weights for seed: W1 uniform in ±sqrt(6/784) (He), W2 uniform in
// ±sqrt(6/(256+10)) (Glorot), biases zero. The values depend on seed alone.
func InitParams(params []float32, seed uint64) {
	if len(params) != NumParams {
		panic(fmt.Sprintf("diloco: InitParams of %d parameters, want %d", len(params), NumParams))
	}
	r := newRNG(seed)
	// The limits are constants, so their rounding to float32 is fixed.
	const lim1, lim2 float32 = 0.08748177652797065 /* sqrt(6/784) */, 0.15018785229652765 /* sqrt(6/266) */
	for i := OffW1; i < OffB1; i++ {
		params[i] = r.uniform(lim1)
	}
	clear(params[OffB1:OffW2])
	for i := OffW2; i < OffB2; i++ {
		params[i] = r.uniform(lim2)
	}
	clear(params[OffB2:])
}

// W1 returns the view of the first layer's weights, Hidden×InputSize
// row-major, aliasing Params.
func (m *MLP) W1() []float32 { return m.Params[OffW1:OffB1:OffB1] }

// B1 returns the view of the first layer's biases, aliasing Params.
func (m *MLP) B1() []float32 { return m.Params[OffB1:OffW2:OffW2] }

// W2 returns the view of the second layer's weights, NumClasses×Hidden
// row-major, aliasing Params.
func (m *MLP) W2() []float32 { return m.Params[OffW2:OffB2:OffB2] }

// B2 returns the view of the second layer's biases, aliasing Params.
func (m *MLP) B2() []float32 { return m.Params[OffB2:NumParams:NumParams] }

// grow makes the scratch buffers hold a batch of n.
func (m *MLP) grow(n int) {
	if cap(m.h) < n*Hidden {
		m.h = make([]float32, n*Hidden)
		m.dh = make([]float32, n*Hidden)
		m.z = make([]float32, n*NumClasses)
		m.dz = make([]float32, n*NumClasses)
		m.nz = make([]int, n)
	}
	m.h = m.h[:n*Hidden]
	m.dh = m.dh[:n*Hidden]
	m.z = m.z[:n*NumClasses]
	m.dz = m.dz[:n*NumClasses]
}

// Forward runs the model on a batch of n > 0 images, x holding n*InputSize
// pixels, and returns the n*NumClasses logits. The returned slice belongs to
// the MLP and is overwritten by the next Forward. The MLP keeps a reference
// to x for Backward: the caller must not change x until then.
//
// The logits of a sample depend only on that sample and the parameters, not
// on the rest of the batch.
func (m *MLP) Forward(x []float32, n int) []float32 {
	if len(m.Params) != NumParams {
		panic(fmt.Sprintf("diloco: MLP has %d parameters, want %d", len(m.Params), NumParams))
	}
	if n <= 0 {
		panic(fmt.Sprintf("diloco: Forward of a batch of %d", n))
	}
	x = x[:n*InputSize]
	m.grow(n)
	m.x, m.n = x, n
	w1, b1, w2, b2 := m.W1(), m.B1(), m.W2(), m.B2()
	h, z := m.h, m.z
	var lanes [16]float32
	for j := range Hidden {
		w := w1[j*InputSize : (j+1)*InputSize : (j+1)*InputSize]
		bj := b1[j]
		b := 0
		for ; b+4 <= n; b += 4 {
			dot4(w, x[b*InputSize:], InputSize, &lanes)
			h[b*Hidden+j] = relu(sum4(lanes[0:4]) + bj)
			h[(b+1)*Hidden+j] = relu(sum4(lanes[4:8]) + bj)
			h[(b+2)*Hidden+j] = relu(sum4(lanes[8:12]) + bj)
			h[(b+3)*Hidden+j] = relu(sum4(lanes[12:16]) + bj)
		}
		for ; b+2 <= n; b += 2 {
			s0, s1 := dot2(w, x[b*InputSize:(b+1)*InputSize], x[(b+1)*InputSize:(b+2)*InputSize])
			h[b*Hidden+j] = relu(s0 + bj)
			h[(b+1)*Hidden+j] = relu(s1 + bj)
		}
		if b < n {
			h[b*Hidden+j] = relu(dot(w, x[b*InputSize:(b+1)*InputSize]) + bj)
		}
	}
	for b := range n {
		hb := h[b*Hidden : (b+1)*Hidden]
		for k := range NumClasses {
			z[b*NumClasses+k] = dot(w2[k*Hidden:(k+1)*Hidden], hb) + b2[k]
		}
	}
	return z
}

// Backward computes the gradient of the mean cross-entropy loss of the last
// Forward's batch, whose labels are y (n of them), and writes it into grads,
// which must have length NumParams and uses the layout of Params. Every
// element of grads is overwritten. It returns the mean loss.
func (m *MLP) Backward(y []uint8, grads []float32) float32 {
	n := m.n
	if len(grads) != NumParams {
		panic(fmt.Sprintf("diloco: gradient of %d elements, want %d", len(grads), NumParams))
	}
	y = y[:n]
	x, h, z, dz, dh := m.x, m.h, m.z, m.dz, m.dh
	w2 := m.W2()
	// Softmax and loss, one sample at a time.
	var total float64
	fn := float32(n)
	for b := range n {
		var p [NumClasses]float32
		loss := softmax(z[b*NumClasses:(b+1)*NumClasses], y[b], &p)
		total += loss
		for k := range NumClasses {
			t := p[k]
			if k == int(y[b]) {
				t -= 1
			}
			dz[b*NumClasses+k] = t / fn
		}
	}
	clear(grads)
	gw1 := grads[OffW1:OffB1:OffB1]
	gb1 := grads[OffB1:OffW2:OffW2]
	gw2 := grads[OffW2:OffB2:OffB2]
	gb2 := grads[OffB2:NumParams:NumParams]
	// Second layer: gW2[k] = sum over b of dz[b][k] * h[b], in batch order.
	for k := range NumClasses {
		row := gw2[k*Hidden : (k+1)*Hidden]
		var sb float32
		for b := range n {
			g := dz[b*NumClasses+k]
			axpy(row, g, h[b*Hidden:(b+1)*Hidden])
			sb += g
		}
		gb2[k] = sb
	}
	// Back through W2 and the ReLU: dh[b] = sum over k of dz[b][k] * W2[k],
	// masked where the unit was off.
	for b := range n {
		dhb := dh[b*Hidden : (b+1)*Hidden : (b+1)*Hidden]
		clear(dhb)
		for k := range NumClasses {
			axpy(dhb, dz[b*NumClasses+k], w2[k*Hidden:(k+1)*Hidden])
		}
		hb := h[b*Hidden : (b+1)*Hidden : (b+1)*Hidden]
		for j, v := range hb {
			if v <= 0 {
				dhb[j] = 0
			}
		}
	}
	// First layer: gW1[j] = sum over b of dh[b][j] * x[b], in batch order.
	// Samples with dh[b][j] == 0 add nothing and are skipped.
	nz := m.nz[:0]
	for j := range Hidden {
		nz = nz[:0]
		var sb float32
		for b := range n {
			if g := dh[b*Hidden+j]; g != 0 {
				nz = append(nz, b)
				sb += g
			}
		}
		gb1[j] = sb
		row := gw1[j*InputSize : (j+1)*InputSize : (j+1)*InputSize]
		i := 0
		for ; i+4 <= len(nz); i += 4 {
			b0, b1, b2, b3 := nz[i], nz[i+1], nz[i+2], nz[i+3]
			a := [4]float32{dh[b0*Hidden+j], dh[b1*Hidden+j], dh[b2*Hidden+j], dh[b3*Hidden+j]}
			axpy4(row, &a, x[b0*InputSize:(b0+1)*InputSize], x[b1*InputSize:(b1+1)*InputSize],
				x[b2*InputSize:(b2+1)*InputSize], x[b3*InputSize:(b3+1)*InputSize])
		}
		for ; i+2 <= len(nz); i += 2 {
			b0, b1 := nz[i], nz[i+1]
			axpy2(row, dh[b0*Hidden+j], x[b0*InputSize:(b0+1)*InputSize], dh[b1*Hidden+j], x[b1*InputSize:(b1+1)*InputSize])
		}
		if i < len(nz) {
			b0 := nz[i]
			axpy(row, dh[b0*Hidden+j], x[b0*InputSize:(b0+1)*InputSize])
		}
	}
	m.nz = nz
	return float32(total / float64(n))
}

// LossGrad runs Forward and Backward on one batch: n = len(y) images in x.
// It writes the gradient of the mean loss into grads and returns the mean
// loss.
func (m *MLP) LossGrad(x []float32, y []uint8, grads []float32) float32 {
	m.Forward(x, len(y))
	return m.Backward(y, grads)
}

// evalChunk is the number of images evaluated per Forward by Loss and
// Accuracy.
const evalChunk = 256

// Loss returns the mean cross-entropy loss of the model over all of d (NaN
// for an empty set). It reuses the buffers of Forward, so it must not come
// between a Forward and its Backward.
func (m *MLP) Loss(d *Dataset) float64 {
	var total float64
	var p [NumClasses]float32
	for lo := 0; lo < d.N; lo += evalChunk {
		n := min(evalChunk, d.N-lo)
		z := m.Forward(d.X[lo*InputSize:], n)
		for b := range n {
			total += softmax(z[b*NumClasses:(b+1)*NumClasses], d.Y[lo+b], &p)
		}
	}
	m.x = nil
	return total / float64(d.N)
}

// Accuracy returns the fraction of the images of d whose label is the
// model's top class (the first one on ties), NaN for an empty set. Like
// Loss, it must not come between a Forward and its Backward.
func (m *MLP) Accuracy(d *Dataset) float64 {
	correct := 0
	for lo := 0; lo < d.N; lo += evalChunk {
		n := min(evalChunk, d.N-lo)
		z := m.Forward(d.X[lo*InputSize:], n)
		for b := range n {
			if argmax(z[b*NumClasses:(b+1)*NumClasses]) == int(d.Y[lo+b]) {
				correct++
			}
		}
	}
	m.x = nil
	return float64(correct) / float64(d.N)
}

// argmax returns the index of the first largest element of z.
func argmax(z []float32) int {
	best := 0
	for k, v := range z {
		if v > z[best] {
			best = k
		}
	}
	return best
}

// softmax writes the softmax of the logits z into p and returns the
// cross-entropy loss of label y, log(sum(exp(z))) - z[y], computed stably.
func softmax(z []float32, y uint8, p *[NumClasses]float32) float64 {
	z = z[:NumClasses]
	mx := z[0]
	for _, v := range z[1:] {
		if v > mx {
			mx = v
		}
	}
	var sum float32
	for k, v := range z {
		e := float32(expDet(float64(v - mx)))
		p[k] = e
		sum += e
	}
	for k := range p {
		p[k] /= sum
	}
	return logDet(float64(sum)) - float64(z[y]-mx)
}

// relu returns max(v, 0).
func relu(v float32) float32 {
	if v > 0 {
		return v
	}
	return 0
}

// dot returns the dot product of a and b (len(b) >= len(a), len(a) a
// multiple of 4) with four partial sums, lane i taking the products at
// positions equal to i mod 4, combined as (s0+s1)+(s2+s3). Every product is
// rounded before it is added, so no FMA can change the result.
func dot(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	for i := 0; i+4 <= len(a); i += 4 {
		a4 := a[i : i+4 : i+4]
		b4 := b[i : i+4 : i+4]
		s0 += float32(a4[0] * b4[0])
		s1 += float32(a4[1] * b4[1])
		s2 += float32(a4[2] * b4[2])
		s3 += float32(a4[3] * b4[3])
	}
	return (s0 + s1) + (s2 + s3)
}

// dot2 returns dot(w, x0) and dot(w, x1), bit for bit, in one pass over w.
func dot2(w, x0, x1 []float32) (float32, float32) {
	x0 = x0[:len(w)]
	x1 = x1[:len(w)]
	var s0, s1, s2, s3, t0, t1, t2, t3 float32
	for i := 0; i+4 <= len(w); i += 4 {
		w4 := w[i : i+4 : i+4]
		a4 := x0[i : i+4 : i+4]
		b4 := x1[i : i+4 : i+4]
		s0 += float32(w4[0] * a4[0])
		s1 += float32(w4[1] * a4[1])
		s2 += float32(w4[2] * a4[2])
		s3 += float32(w4[3] * a4[3])
		t0 += float32(w4[0] * b4[0])
		t1 += float32(w4[1] * b4[1])
		t2 += float32(w4[2] * b4[2])
		t3 += float32(w4[3] * b4[3])
	}
	return (s0 + s1) + (s2 + s3), (t0 + t1) + (t2 + t3)
}

// axpy adds a*x to y element by element (len(x) >= len(y), len(y) a
// multiple of 4), rounding each product first.
func axpy(y []float32, a float32, x []float32) {
	x = x[:len(y)]
	for i := 0; i+4 <= len(y); i += 4 {
		y4 := y[i : i+4 : i+4]
		x4 := x[i : i+4 : i+4]
		y4[0] += float32(a * x4[0])
		y4[1] += float32(a * x4[1])
		y4[2] += float32(a * x4[2])
		y4[3] += float32(a * x4[3])
	}
}

// axpy2 adds a0*x0 and then a1*x1 to y, bit for bit as two calls of axpy,
// in one pass over y.
func axpy2(y []float32, a0 float32, x0 []float32, a1 float32, x1 []float32) {
	x0 = x0[:len(y)]
	x1 = x1[:len(y)]
	for i := 0; i+4 <= len(y); i += 4 {
		y4 := y[i : i+4 : i+4]
		p4 := x0[i : i+4 : i+4]
		q4 := x1[i : i+4 : i+4]
		y4[0] = (y4[0] + float32(a0*p4[0])) + float32(a1*q4[0])
		y4[1] = (y4[1] + float32(a0*p4[1])) + float32(a1*q4[1])
		y4[2] = (y4[2] + float32(a0*p4[2])) + float32(a1*q4[2])
		y4[3] = (y4[3] + float32(a0*p4[3])) + float32(a1*q4[3])
	}
}
