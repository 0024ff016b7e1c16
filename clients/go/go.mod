module github.com/ferrymq/ferrymq/clients/go

go 1.22
