package wire

// Link messages between ring neighbours: the opening of a data link. Data frames follow (data.go).

// LinkHello opens a data link from peer From to peer To; Index is the connection's slot in the pool.
type LinkHello struct {
	Token string
	From  uint64
	To    uint64
	Index uint16
}

func (m *LinkHello) Append(b []byte) []byte {
	b = appendString(b, m.Token)
	b = appendU64(b, m.From)
	b = appendU64(b, m.To)
	return appendU16(b, m.Index)
}

func (m *LinkHello) decode(d *decoder) {
	*m = LinkHello{Token: d.str("token"), From: d.u64("from"), To: d.u64("to"), Index: d.u16("index")}
}

// LinkAck accepts or refuses a LinkHello.
type LinkAck struct {
	OK     bool
	Reason string
}

func (m *LinkAck) Append(b []byte) []byte {
	b = appendBool(b, m.OK)
	return appendString(b, m.Reason)
}

func (m *LinkAck) decode(d *decoder) { *m = LinkAck{OK: d.boolean("ok"), Reason: d.str("reason")} }

func (*LinkHello) Type() Type { return TypeLinkHello }
func (*LinkAck) Type() Type   { return TypeLinkAck }
