module github.com/ferrymq/ferrymq/clients/go

go 1.22

require (
	github.com/vmihailenco/msgpack/v5 v5.4.1
	google.golang.org/protobuf v1.36.6
)

require github.com/vmihailenco/tagparser/v2 v2.0.0 // indirect
