//go:build ignore

// Command gen writes the Fashion-MNIST subset that package diloco embeds: the
// first 1000 images of each class from the training set and the first 200 of
// each class from the test set, in their original order, as gzip-compressed
// IDX files next to this program.
//
// Run it from this directory after installing the full data set (Debian
// package dataset-fashion-mnist):
//
//	go run gen.go -src /usr/share/datasets/fashion-mnist
package main

import (
	"bytes"
	"compress/gzip"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/concord-ccl/concord/diloco"
)

func main() {
	src := flag.String("src", "/usr/share/datasets/fashion-mnist", "directory holding the full Fashion-MNIST IDX files")
	dst := flag.String("dst", ".", "directory to write the subset to")
	flag.Parse()
	train, test, err := diloco.LoadDir(*src)
	if err != nil {
		log.Fatal(err)
	}
	if err := write(*dst, "train", train, 1000); err != nil {
		log.Fatal(err)
	}
	if err := write(*dst, "t10k", test, 200); err != nil {
		log.Fatal(err)
	}
}

// write keeps the first perClass images of every class of d and writes them
// as prefix-images-idx3-ubyte.gz and prefix-labels-idx1-ubyte.gz.
func write(dir, prefix string, d *diloco.Dataset, perClass int) error {
	var count [diloco.NumClasses]int
	var pix, lab []byte
	for i := 0; i < d.N; i++ {
		c := d.Y[i]
		if count[c] == perClass {
			continue
		}
		count[c]++
		lab = append(lab, c)
		for _, v := range d.X[i*diloco.InputSize : (i+1)*diloco.InputSize] {
			// X holds byte/255; the rounding recovers the byte exactly.
			pix = append(pix, byte(v*255+0.5))
		}
	}
	for c, k := range count {
		if k != perClass {
			return fmt.Errorf("class %d has only %d images", c, k)
		}
	}
	n := len(lab)
	if err := save(filepath.Join(dir, prefix+"-images-idx3-ubyte.gz"), &diloco.IDX{Type: diloco.IDXUint8, Dims: []int{n, 28, 28}, Data: pix}); err != nil {
		return err
	}
	return save(filepath.Join(dir, prefix+"-labels-idx1-ubyte.gz"), &diloco.IDX{Type: diloco.IDXUint8, Dims: []int{n}, Data: lab})
}

// save writes x gzip-compressed at the best level, with an empty gzip header
// so that the output depends on the content only.
func save(path string, x *diloco.IDX) error {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return err
	}
	if err := diloco.WriteIDX(zw, x); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	fmt.Printf("%s: %d bytes\n", path, buf.Len())
	return os.WriteFile(path, buf.Bytes(), 0o644)
}
