//go:build !amd64 || purego

package rings

// Without a vector kernel every element goes through addSlice.
func addF32Vec(d, s []float32) int { return 0 }

func addF64Vec(d, s []float64) int { return 0 }

func addF32OntoVec(d, s []float32) int { return 0 }

func addF64OntoVec(d, s []float64) int { return 0 }

func addF32OntoSaveVec(d, s, save []float32) int { return 0 }

func addF64OntoSaveVec(d, s, save []float64) int { return 0 }

func addF32ToVec(d, a, b []float32) int { return 0 }

func addF64ToVec(d, a, b []float64) int { return 0 }
